package worker

import (
	"context"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Plugin extends a Worker: a value in Config.Plugins that implements any of
// the interfaces below, each of which the worker uses where it belongs, so
// that one line of configuration installs a plugin whole
// (plugin/eotel's Tracer and plugin/eprom's Metrics implement them).
// Several plugins compose: the first listed wraps outermost.
//
//   - [SubscriberPlugin] wraps the Subscriber the commands come from;
//   - [PublisherPlugin] wraps the Publisher of the outbox relay and the
//     dead letters;
//   - [MiddlewarePlugin] wraps each message's handling, outside the dedupe
//     middleware (the claim, the handler and the commit run inside it, with
//     the context it gives the message), in per-message mode and on batch
//     mode's per-message path;
//   - [StorePlugin] wraps the key store the consumer claims its keys on;
//   - [OutputsPlugin] wraps the writer of the handler's outputs into the
//     outbox, in the handler's transaction;
//   - [consumer.Hooks] receives each message's Event, after Config.Hooks;
//   - [outbox.Hooks] receives each relay batch's event, after
//     Config.OutboxHooks;
//   - [WatchPlugin] is told what the worker runs on, once it consumes.
type Plugin any

// SubscriberPlugin wraps the Subscriber. The messages it delivers must be
// the ones it got (acks and nacks reach the Kafka Subscriber through them).
type SubscriberPlugin interface {
	Subscriber(message.Subscriber) message.Subscriber
}

// PublisherPlugin wraps the Publisher of the relay and the dead letters.
type PublisherPlugin interface {
	Publisher(message.Publisher) message.Publisher
}

// MiddlewarePlugin wraps each message's handling, outside the dedupe
// middleware.
type MiddlewarePlugin interface {
	Middleware(message.HandlerFunc) message.HandlerFunc
}

// OutputsPlugin wraps the writer of the outputs into the outbox. In batch
// mode each output message's context is the context of the command that
// returned it.
type OutputsPlugin interface {
	Outputs(consumer.OutputsWriter) consumer.OutputsWriter
}

// StorePlugin wraps the key store that the dedupe middleware and the batch
// consumer claim keys on (the worker's *pgstore.Store). The key clean-up,
// the positions and Running.Store stay on the store itself.
type StorePlugin interface {
	Store(consumer.BatchStore) consumer.BatchStore
}

// WatchPlugin is told, once the worker consumes, what it runs on (the
// sources of gauges read at scrape, say).
type WatchPlugin interface {
	Watch(Running)
}

// Running is what a running Worker runs on.
type Running struct {
	// Store is the key store (Stats, the positions).
	Store *pgstore.Store
	// Relay is the outbox relay (Stats); nil with Config.NoRelay.
	Relay *outbox.Relay
	// Config is the worker's configuration with its defaults.
	Config Config
	// Offsets reads where each partition of the topic stands
	// ([Worker.Offsets]); nil without Config.Brokers.
	Offsets func(ctx context.Context) ([]PartitionOffsets, error)
}

// plugins returns the plugins that implement T, outermost first.
func plugins[T any](ps []Plugin) []T {
	var out []T
	for _, p := range ps {
		if t, ok := p.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// wrap applies the wraps of ps to v, the first plugin outermost.
func wrap[T, V any](ps []Plugin, v V, with func(T, V) V) V {
	found := plugins[T](ps)
	for i := len(found) - 1; i >= 0; i-- {
		v = with(found[i], v)
	}
	return v
}

// messageHooks is Config.Hooks and then each plugin's consumer.Hooks.
type messageHooks []consumer.Hooks

func (hs messageHooks) OnMessage(ctx context.Context, ev consumer.Event) {
	for _, h := range hs {
		h.OnMessage(ctx, ev)
	}
}

// batchHooks is Config.OutboxHooks and then each plugin's outbox.Hooks.
type batchHooks []outbox.Hooks

func (hs batchHooks) OnBatch(ctx context.Context, ev outbox.BatchEvent) {
	for _, h := range hs {
		h.OnBatch(ctx, ev)
	}
}

// hooksAsPlugin moves c.Hooks into c.Plugins, first, when it is a Plugin
// beyond its hooks (a Tracer given as Hooks would otherwise put the
// outcome on a span that its Middleware never started, and leave out its
// Subscriber, Publisher and Outputs); a Plugins entry that is the same
// value is not installed twice.
func hooksAsPlugin(c Config) Config {
	h := c.Hooks
	switch h.(type) {
	case SubscriberPlugin, PublisherPlugin, MiddlewarePlugin, OutputsPlugin, StorePlugin, WatchPlugin:
	default:
		return c
	}
	ps := []Plugin{h}
	for _, p := range c.Plugins {
		if !same(p, h) {
			ps = append(ps, p)
		}
	}
	c.Hooks, c.Plugins = nil, ps
	return c
}

// same says whether a and b are the same value (false for values that
// == cannot compare).
func same(a, b any) (eq bool) {
	defer func() {
		if recover() != nil {
			eq = false
		}
	}()
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

// withPlugins folds the plugins' hooks into c's: Hooks and OutboxHooks then
// call the user's, then each plugin's.
func withPlugins(c Config) Config {
	if len(c.Plugins) == 0 {
		return c
	}
	var mh messageHooks
	if c.Hooks != nil {
		mh = append(mh, c.Hooks)
	}
	mh = append(mh, plugins[consumer.Hooks](c.Plugins)...)
	if len(mh) > 0 {
		c.Hooks = mh
	}
	var bh batchHooks
	if c.OutboxHooks != nil {
		bh = append(bh, c.OutboxHooks)
	}
	bh = append(bh, plugins[outbox.Hooks](c.Plugins)...)
	if len(bh) > 0 {
		c.OutboxHooks = bh
	}
	return c
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Worker consumes one topic with one handler, effectively once. New
// builds it; Run runs it until its context ends.
type Worker struct {
	cfg    Config
	pool   *pgxpool.Pool
	store  *pgstore.Store
	writer *outbox.Writer
	// outputs is what the dedupe middleware writes the handler's outputs
	// with: the outbox for OutputTopic, or a writer that refuses them.
	outputs consumer.OutputsWriter

	running chan struct{}
	started atomic.Bool
	// consuming is set while the router or the batch consumer runs.
	consuming atomic.Bool
	// down lists the dependencies found unavailable, until consuming.
	down atomic.Pointer[[]string]
	// subHealth is the transport's Subscriber's own health (kgopubsub's: a
	// member that cannot join its group), when it reports one; set before
	// consuming.
	subHealth func() error
}

// subscriberHealth is a Subscriber that says whether it consumes
// (kgopubsub.Subscriber: nil, or why a member cannot join its group).
type subscriberHealth interface{ Health() error }

// New returns a worker on pool for cfg. It checks the configuration and
// connects to nothing: Run waits for Postgres and Kafka.
func New(pool *pgxpool.Pool, cfg *Config) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("worker: the pool is nil")
	}
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: c.Schema, Logger: c.Logger, Layout: c.KeyLayout})
	if err != nil {
		return nil, err
	}
	c.Schema = store.Config().Schema
	writer, err := outbox.NewWriter(&outbox.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: c, pool: pool, store: store, writer: writer, running: make(chan struct{})}
	w.outputs = refuseOutputs{}
	if c.OutputTopic != "" {
		w.outputs = writer.Outputs(c.OutputTopic)
	}
	w.outputs = wrap(c.Plugins, w.outputs, func(p OutputsPlugin, o consumer.OutputsWriter) consumer.OutputsWriter { return p.Outputs(o) })
	w.down.Store(&[]string{"starting"})
	return w, nil
}

// Store returns the worker's key store (for Stats, say).
func (w *Worker) Store() *pgstore.Store { return w.store }

// Config returns the worker's configuration with its defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Running is closed once the worker consumes.
func (w *Worker) Running() <-chan struct{} { return w.running }

// Run runs the worker until ctx ends, then stops gracefully and returns
// nil. First it waits, with back-off, until Postgres answers with the
// worker's tables and Kafka with its topics (running the migrations and
// creating the topics when Config.Migrate and Config.CreateTopics say so),
// reporting what is down in Health. Then it consumes, relays the outbox and
// removes expired keys. When ctx ends it stops taking messages, lets those
// in flight finish (up to Config.DrainTimeout), commits their offsets,
// and publishes what is left in the outbox. A Worker runs once.
func (w *Worker) Run(ctx context.Context) (err error) {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: Run called twice: a Worker runs once")
	}
	// A pool closed under the worker never serves it again: Run stops as
	// its context ending would stop it, and returns errPoolClosed.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go w.watchPool(ctx, stop)
	defer func() {
		if cause := context.Cause(ctx); err == nil && errors.Is(cause, errPoolClosed) {
			err = cause
		}
	}()
	log := w.cfg.Logger
	if ready, refused := w.waitReady(ctx); !ready {
		w.closeOwn()
		if refused != nil {
			return fmt.Errorf("worker: %w", refused)
		}
		return nil
	}
	if w.cfg.KeyLayout == pgstore.LayoutSingleTable {
		// Once a worker of the partitioned layout ran on the schema, this
		// one could apply a key that one applied: refused at start.
		if err := w.store.Check(ctx); errors.Is(err, pgstore.ErrSingleTableClosed) {
			w.closeOwn()
			return fmt.Errorf("worker: %w", err)
		}
	}
	if w.cfg.CleanupInterval > 0 {
		// A role that cannot run the key clean-up would fail it forever
		// (and, on the partitioned layout, every claim once the partitions
		// created ahead run out): refused here, at start.
		if err := w.store.CheckMaintenance(ctx); errors.Is(err, dedupe.ErrMisconfigured) {
			w.closeOwn()
			return fmt.Errorf("worker: %w; or set Config.CleanupInterval to -1 and run it in a process of that role", err)
		} else if err != nil {
			log.Warn("worker: could not check the key clean-up's rights", "err", redact.Password(err.Error()))
		}
	}
	if w.registersScope() {
		// A second group on Scope and Topic would skip every command the
		// first applied: refused here, unless it takes the scope over.
		prev, err := w.registerScope(ctx)
		if err != nil || ctx.Err() != nil {
			w.closeOwn()
			if err == nil {
				return nil
			}
			return fmt.Errorf("worker: %w", err)
		}
		if prev.Group != "" {
			log.Warn("worker: the group takes the scope over: the commands of the topic that the previous group applied are "+
				"skipped as duplicates, the others applied by this group (Config.TakeOver)",
				"scope", w.cfg.Scope, "topic", w.cfg.Topic, "group", w.cfg.Group, "previous_group", prev.Group, "previous_since", prev.Since)
		}
	}
	if len(w.cfg.Brokers) > 0 {
		if err := kafkapubsub.CheckTTL(ctx, w.cfg.Brokers, w.cfg.Security, w.cfg.Topic, w.ttl()); err != nil {
			log.Warn("worker: key retention", "err", err)
		}
	}
	sub, pub, err := w.pubsub()
	if err != nil {
		return err
	}
	defer pub.Close()

	var relay *outbox.Relay
	if !w.cfg.NoRelay {
		relay, err = outbox.NewRelay(w.pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: w.cfg.Schema},
			Hooks: w.cfg.OutboxHooks, Logger: log, PollInterval: w.cfg.RelayPollInterval})
		if err != nil {
			_ = sub.Close()
			return err
		}
	}
	// The relay and the clean-up outlive the consumer's drain: the last
	// handlers' outputs are published after it.
	var wg sync.WaitGroup
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	if relay != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = relay.Run(bgCtx) }()
	}
	if w.cfg.CleanupInterval > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.store.RunCleanup(bgCtx, w.cfg.CleanupInterval, nil) }()
	}
	running := Running{Store: w.store, Relay: relay, Config: w.cfg}
	if len(w.cfg.Brokers) > 0 && !sharedGroup(&w.cfg) {
		running.Offsets = w.Offsets
	}
	for _, p := range plugins[WatchPlugin](w.cfg.Plugins) {
		p.Watch(running)
	}

	if w.cfg.BatchHandler != nil {
		err = w.runBatch(ctx, sub, pub)
	} else {
		err = w.runRouter(ctx, sub, pub)
	}
	if err == nil && ctx.Err() == nil {
		// The Subscriber closed its channel on its own (a static member
		// fenced by another with its InstanceID, for one): the worker
		// consumes nothing more, so it stops instead of idling as healthy.
		err = ErrSubscriptionEnded
		w.cfg.Logger.Error("worker: stopping", "topic", w.cfg.Topic, "err", err)
	}
	stopBackground()
	wg.Wait()
	if relay != nil {
		w.flush(ctx, relay)
	}
	return err
}

// registerScope records the worker's group for its scope and topic
// (pgstore.Store.RegisterScope). While Postgres is unavailable (it went
// down again after waitReady, or a pooler in front of it refuses logins
// for a while after the server's restart), it tries again with back-off
// up to Config.StartupBackoff, as waitReady does: only a refusal (another
// group holds the scope) or ctx's end stops it. It returns a zero
// ScopeOwner and no error when ctx ends first.
func (w *Worker) registerScope(ctx context.Context) (pgstore.ScopeOwner, error) {
	wait := backoff.New(100*time.Millisecond, w.cfg.StartupBackoff)
	for {
		prev, err := w.store.RegisterScope(ctx, w.cfg.Scope, w.cfg.Topic, w.cfg.Group, w.cfg.TakeOver)
		if err == nil || !dedupe.IsRetryable(err) {
			return prev, err
		}
		if ctx.Err() != nil {
			return pgstore.ScopeOwner{}, nil
		}
		d := wait.Next()
		w.cfg.Logger.Warn("worker: Postgres unavailable while registering the scope; trying again",
			"scope", w.cfg.Scope, "retry_in", d, "err", redact.Password(err.Error()))
		if clock.Sleep(ctx, d) != nil {
			return pgstore.ScopeOwner{}, nil
		}
	}
}

// registersScope says whether the worker records its group for its scope
// and topic (pgstore.Store.RegisterScope): when it makes its Subscriber,
// whose group it knows.
func (w *Worker) registersScope() bool { return w.cfg.Subscriber == nil }

// ErrSubscriptionEnded is Run's error when the Subscriber ends the
// subscription on its own, before Run's context ends: the worker would
// consume nothing more. A supervisor restarts the worker once the cause,
// in the Subscriber's log, is fixed (two static members with one
// InstanceID, for one: see kgopubsub).
var ErrSubscriptionEnded = errors.New("worker: the subscription ended while the worker ran: its Subscriber stopped " +
	"consuming (its log says why, e.g. another member joined the group with this member's InstanceID); start the worker " +
	"again once that is fixed")

// errPoolClosed is Run's error when the pool is closed while it runs.
var errPoolClosed = errors.New("worker: the pgx pool was closed while the worker ran, so no message can be applied " +
	"again: close the pool after Run returns (cancel Run's context, wait for Run, then pool.Close()); the messages " +
	"not applied were not committed and are delivered again")

// poolCheckEvery is how often Run checks that its pool is open.
const poolCheckEvery = 2 * time.Second

// watchPool cancels the run with errPoolClosed once the pool is closed.
func (w *Worker) watchPool(ctx context.Context, stop context.CancelCauseFunc) {
	t := time.NewTicker(poolCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := w.pool.Ping(pctx)
		cancel()
		if errors.Is(err, puddle.ErrClosedPool) {
			w.cfg.Logger.Error("worker: stopping: the pgx pool was closed while the worker ran", "err", errPoolClosed)
			stop(errPoolClosed)
			return
		}
	}
}

// runRouter is per-message mode: a Watermill router with the chain in its
// one correct order.
func (w *Worker) runRouter(ctx context.Context, sub message.Subscriber, pub message.Publisher) error {
	log := w.cfg.Logger
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: w.cfg.DrainTimeout}, watermill.NewSlogLogger(log))
	if err != nil {
		_ = sub.Close()
		return err
	}
	poison, err := middleware.PoisonQueueWithFilter(pub, w.cfg.DeadLetterTopic, dedupe.IsPermanent)
	if err != nil {
		_ = sub.Close()
		return err
	}
	// No Retry: under a router the dedupe middleware nacks every failure
	// that is not permanent, and the Subscriber delivers it again after a
	// back-off; only permanent errors reach the PoisonQueue.
	router.AddMiddleware(poison, middleware.Timeout(w.cfg.Timeout))
	for _, p := range plugins[MiddlewarePlugin](w.cfg.Plugins) {
		router.AddMiddleware(p.Middleware)
	}
	mw, err := consumer.NewMiddleware(w.keys(), w.consumerConfig())
	if err != nil {
		_ = sub.Close()
		return err
	}
	router.AddMiddleware(mw.Middleware, middleware.Recoverer)
	handler := consumer.TxHandler(w.cfg.Handler)
	// The middleware writes the outputs to the outbox and returns none: the
	// handler's publisher refuses anything that would bypass it. The router
	// closes it when it stops; the relay keeps the worker's own.
	router.AddHandler(w.cfg.Scope, w.cfg.Topic, sub, w.cfg.OutputTopic, refusePublisher{}, handler)
	go func() {
		select {
		case <-router.Running():
			w.consuming.Store(true)
			close(w.running)
		case <-ctx.Done():
		}
	}()
	err = router.Run(ctx)
	w.consuming.Store(false)
	return err
}

// runBatch is batch mode: a consumer.BatchConsumer.
func (w *Worker) runBatch(ctx context.Context, sub message.Subscriber, pub message.Publisher) error {
	defer sub.Close()
	cfg := &consumer.BatchConfig{
		Config:  *w.consumerConfig(),
		MaxSize: w.cfg.BatchSize, MaxWait: w.cfg.BatchWait, Workers: w.cfg.BatchWorkers, Timeout: w.cfg.Timeout,
		Publisher: pub, DeadLetterTopic: w.cfg.DeadLetterTopic,
	}
	perMessage, err := consumer.DefaultPerMessage(cfg)
	if err != nil {
		return err
	}
	for _, p := range plugins[MiddlewarePlugin](w.cfg.Plugins) {
		perMessage = append(perMessage, p.Middleware)
	}
	cfg.PerMessage = perMessage
	bc, err := consumer.NewBatchConsumer(w.keys(), w.cfg.BatchHandler, cfg)
	if err != nil {
		return err
	}
	w.consuming.Store(true)
	close(w.running)
	err = bc.Subscribe(ctx, sub, w.cfg.Topic)
	w.consuming.Store(false)
	return err
}

// keys returns the store the consumer claims its keys on: the worker's,
// wrapped by the StorePlugins.
func (w *Worker) keys() consumer.BatchStore {
	return wrap(w.cfg.Plugins, consumer.BatchStore(w.store), func(p StorePlugin, s consumer.BatchStore) consumer.BatchStore { return p.Store(s) })
}

// consumerConfig is the one consumer.Config of the worker, for the
// middleware and the batch consumer alike.
func (w *Worker) consumerConfig() *consumer.Config {
	return &consumer.Config{
		Scope: w.cfg.Scope, KeyFunc: w.cfg.KeyFunc, FingerprintFunc: w.cfg.FingerprintFunc, MissingKey: w.cfg.MissingKey,
		TTL: w.cfg.TTL, Outputs: w.outputs, MaxAttempts: w.cfg.MaxAttempts, Hooks: w.cfg.Hooks, Logger: w.cfg.Logger,
		LogDuplicates: w.cfg.LogDuplicates, AcrossTopics: w.cfg.AcrossTopics,
	}
}

func (w *Worker) ttl() time.Duration {
	if w.cfg.TTL > 0 {
		return w.cfg.TTL
	}
	return w.store.Config().TTL
}

// flush publishes what the last handlers wrote to the outbox after the
// relay stopped (a batch commits hundreds of outputs at once: the relay
// may be behind), for up to DrainTimeout.
func (w *Worker) flush(ctx context.Context, relay *outbox.Relay) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.DrainTimeout)
	defer cancel()
	for {
		n, err := relay.RunOnce(fctx)
		if err != nil {
			w.cfg.Logger.Warn("worker: final outbox flush failed; the next relay publishes the rest", "err", err)
			return
		}
		if n == 0 {
			return
		}
	}
}

// migrate runs exactly's migrations (Config.Migrate).
func (w *Worker) migrate(ctx context.Context) error {
	return migrations.Migrate(ctx, w.pool, &migrations.Config{Schema: w.cfg.Schema, Logger: w.cfg.Logger})
}

// names joins dependency names for logs and Health.
func names(down []string) string { return strings.Join(down, ", ") }

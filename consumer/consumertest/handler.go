package consumertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
)

// Store is what a [Handler] runs on: the middleware's [consumer.Store], and
// Get to read a key back. [*pgstore.Store] and [*MemStore] implement it.
type Store interface {
	consumer.Store
	// Get returns the committed record of key, or an error wrapping
	// dedupe.ErrNotFound.
	Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error)
}

// DefaultScope is the Config.Scope of a Handler whose Config leaves it
// empty: the kit's messages come from no router, so they carry no handler
// name to scope keys by.
const DefaultScope = "consumertest"

// Handler runs a Watermill handler through a real [consumer.Middleware],
// one message per Run, as a router would call it.
type Handler struct {
	store Store
	h     message.HandlerFunc
}

// NewHandler wraps h (a [consumer.TxHandler], or any message.HandlerFunc)
// in a [consumer.Middleware] on store with cfg. cfg may be nil; an empty
// cfg.Scope becomes [DefaultScope]; cfg.Hooks still gets every event.
func NewHandler(store Store, h message.HandlerFunc, cfg *consumer.Config) (*Handler, error) {
	if h == nil {
		return nil, errors.New("consumertest: NewHandler: handler is nil")
	}
	var c consumer.Config
	if cfg != nil {
		c = *cfg
	}
	capture(&c)
	mw, err := consumer.NewMiddleware(store, &c)
	if err != nil {
		return nil, err
	}
	return &Handler{store: store, h: mw.Middleware(h)}, nil
}

// Result is what one message did.
type Result struct {
	// Outcome is the middleware's outcome for the message.
	Outcome consumer.Outcome
	// Err is the error the middleware returned to the router; nil when the
	// message was applied or a duplicate.
	Err error
	// Outputs are the messages the middleware returned to the router for
	// publishing: the handler's, or the stored ones on a duplicate. None
	// when Config.Outputs took them.
	Outputs []*message.Message
	// Key is the message's idempotency key; its ID is empty when the
	// message had none.
	Key dedupe.Key
	// Stored reports whether the key is stored (committed) after the
	// message; Record is the key as stored then.
	Stored bool
	Record dedupe.Record
	// StoredOutputs are the output messages in Record.Result: what a
	// duplicate of the message gets back.
	StoredOutputs []*message.Message
	// Event is the middleware's event for the message, as Config.Hooks got it.
	Event consumer.Event
}

type runKey struct{}

// eventSlot keeps the last Event of a message the kit runs (the
// per-message path may report more than one attempt).
type eventSlot struct {
	mu sync.Mutex
	ev consumer.Event
}

func (s *eventSlot) set(ev consumer.Event) { s.mu.Lock(); s.ev = ev; s.mu.Unlock() }

func (s *eventSlot) get() consumer.Event { s.mu.Lock(); defer s.mu.Unlock(); return s.ev }

// capture gives c the kit's defaults: DefaultScope when its Scope is
// empty, and hooks that keep each message's Event in its slot before
// c.Hooks gets it.
func capture(c *consumer.Config) {
	if c.Scope == "" {
		c.Scope = DefaultScope
	}
	user := c.Hooks
	c.Hooks = consumer.HooksFunc(func(ctx context.Context, ev consumer.Event) {
		if slot, ok := ctx.Value(runKey{}).(*eventSlot); ok {
			slot.set(ev)
		}
		if user != nil {
			user.OnMessage(ctx, ev)
		}
	})
}

// Run sends msg through the middleware and the handler with ctx as its
// context, then reads its key back from the store. It fails t when the key
// cannot be read back; what the middleware did, failures included, is in
// the Result.
func (h *Handler) Run(ctx context.Context, t testing.TB, msg *message.Message) Result {
	t.Helper()
	r, err := h.run(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (h *Handler) run(ctx context.Context, msg *message.Message) (Result, error) {
	if msg == nil {
		return Result{}, errors.New("consumertest: Run: message is nil")
	}
	slot := new(eventSlot)
	msg.SetContext(context.WithValue(ctx, runKey{}, slot))
	outs, err := h.h(msg)
	msg.SetContext(ctx)
	ev := slot.get()
	r := Result{Outcome: ev.Outcome, Err: err, Outputs: outs, Event: ev, Key: dedupe.Key{Scope: ev.Scope, ID: ev.Key}}
	return r, readBack(ctx, h.store, &r)
}

// readBack fills r's Stored, Record and StoredOutputs from its key as
// store holds it.
func readBack(ctx context.Context, store interface {
	Get(context.Context, dedupe.Key) (dedupe.Record, error)
}, r *Result) error {
	if r.Key.ID == "" {
		return nil
	}
	rec, err := store.Get(ctx, r.Key)
	switch {
	case errors.Is(err, dedupe.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("consumertest: read key %s back: %w", r.Key, err)
	}
	r.Stored, r.Record = true, rec
	if r.StoredOutputs, err = consumer.StoredOutputs(rec.Result); err != nil {
		return fmt.Errorf("consumertest: key %s: %w", r.Key, err)
	}
	return nil
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
)

// Middleware is the effectively-once Watermill middleware. For each message
// it opens a transaction, claims the message's key, runs the handler with
// that transaction (TxHandler, or TxFromContext), stores the handler's
// output messages as the key's result and commits — before the router acks
// the message, so the Kafka offset moves only after the effects are durable.
//
// A duplicate does not run the handler: the stored outputs are returned, so
// the router re-publishes them with their original UUIDs. A key reused with
// another payload, an invalid key (policy Reject), an invalid payload, a
// poison message (Config.MaxAttempts) and an error the handler marked with
// dedupe.Permanent are permanent errors (dedupe.IsPermanent), returned for
// a PoisonQueue to dead-letter. Any other failure (the handler's, the
// database's, the deployment's) rolls back the handler's writes and the
// key, and the message is applied on a later delivery, once: under a
// Watermill router the middleware nacks the message itself and returns no
// error, so that nothing outside it (a PoisonQueue without the
// dedupe.IsPermanent filter, a Retry) can dead-letter it or have it acked;
// called by other code, it returns the error, for the caller to nack. A
// panic in the handler is recovered into an error, inside the transaction.
type Middleware struct {
	store Store
	cfg   Config

	pool     *pgxpool.Pool // the store's, to read a cut attempt's session
	mu       sync.Mutex
	messages map[string]*msgState // failing messages, by identity
	ackNoted atomic.Bool          // a handler's Ack or Nack was logged
}

// keyOf returns msg's key in scope: Config.KeyFunc's, validated, or with
// MissingKey Derive its coordinates when that fails. The error says why
// there is no valid key.
func (m *Middleware) keyOf(msg *message.Message, scope string) (dedupe.Key, error) {
	id, err := m.cfg.KeyFunc(msg)
	key := dedupe.Key{Scope: scope, ID: id}
	if err == nil {
		err = key.Validate()
	}
	if err != nil && m.cfg.MissingKey == Derive {
		if id, derr := KeyFromOffset(msg); derr == nil {
			key.ID = id
			err = key.Validate()
		}
	}
	return key, err
}

// source returns msg's Kafka coordinates, from Config.Source or else from
// its context.
func (m *Middleware) source(msg *message.Message) (dedupe.Source, bool) {
	if m.cfg.Source != nil {
		return m.cfg.Source(msg)
	}
	return dedupe.SourceFromContext(msg.Context())
}

// NewMiddleware returns the middleware on store: a [*pgstore.Store], or
// consumertest.MemStore in unit tests.
func NewMiddleware(store Store, cfg *Config) (*Middleware, error) {
	if isNil(store) {
		return nil, errors.New("consumer: NewMiddleware: store is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.KeyFunc == nil {
		c.KeyFunc = KeyFromUUID
	}
	if c.FingerprintFunc == nil {
		c.FingerprintFunc = dedupe.RawFingerprint
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	switch {
	case c.MissingKey < Reject || c.MissingKey > Derive:
		return nil, fmt.Errorf("consumer: Config.MissingKey is %v: use Reject, Skip or Derive", c.MissingKey)
	case c.TTL < 0:
		return nil, fmt.Errorf("consumer: Config.TTL is %v: set a positive duration or 0 for the store's", c.TTL)
	case c.Lease < 0:
		return nil, fmt.Errorf("consumer: Config.Lease is %v: set a positive duration, or 0 for transactional mode", c.Lease)
	case c.Lease > 0 && c.Outputs != nil:
		return nil, errors.New("consumer: Config.Outputs needs transactional mode: leave Config.Lease at 0")
	}
	if c.Scope != "" {
		if err := (dedupe.Key{Scope: c.Scope, ID: "x"}).Validate(); err != nil {
			return nil, fmt.Errorf("consumer: Config.Scope: %w", err)
		}
	}
	return &Middleware{store: store, cfg: c, pool: storePool(store), messages: map[string]*msgState{}}, nil
}

// Check verifies, before the router runs, what the middleware needs: the
// store's table ([pgstore.Store.Check]). A configuration error found here
// would otherwise fail every message.
func (m *Middleware) Check(ctx context.Context) error { return m.store.Check(ctx) }

// attemptKey marks a message context that the middleware already ran with;
// activeKey, one it is running with now.
type attemptKey struct{}
type activeKey struct{}

// scopes binds a fixed scope, per store table and topic, to the handler
// that uses it, across every Middleware of the process.
var scopes sync.Map // "key space, scope, topic" → handler name

// Middleware wraps h. Use it as a router or handler middleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		ctx := msg.Context()
		ev := Event{Scope: m.cfg.Scope, Offset: -1}
		if ev.Scope == "" {
			ev.Scope = message.HandlerNameFromCtx(ctx)
		}
		if src, ok := m.source(msg); ok {
			ev.Topic, ev.Partition, ev.Offset = src.Topic, src.Partition, src.Offset
		} else {
			ev.Topic = message.SubscribeTopicFromCtx(ctx)
		}
		nested := ctx.Value(activeKey{}) != nil
		outs, err := m.handle(msg, h, &ev)
		// Leave a mark: a later attempt that finds it on a cancelled context
		// was handed this attempt's context again.
		msg.SetContext(context.WithValue(ctx, attemptKey{}, true))
		ev.Err, ev.Duration = err, time.Since(start)
		if ev.Outcome == "" {
			ev.Outcome = outcomeOf(err)
		}
		m.log(ctx, msg, ev)
		if m.cfg.Hooks != nil {
			m.cfg.Hooks.OnMessage(ctx, ev)
		}
		if err != nil && !nested && !dedupe.IsPermanent(err) && message.HandlerNameFromCtx(ctx) != "" {
			// Under a router, the middleware gives the message back to the
			// Subscriber itself: nacked, the router's Ack is refused, and
			// with no error nothing outside (a PoisonQueue without the
			// dedupe.IsPermanent filter, a Retry) can dead-letter it.
			msg.Nack()
			return nil, nil
		}
		return outs, err
	}
}

// checkScope refuses a fixed scope that a second handler on the same topic
// would share.
func (m *Middleware) checkScope(ctx context.Context, ev *Event) error {
	handler := message.HandlerNameFromCtx(ctx)
	if m.cfg.Scope == "" || handler == "" {
		return nil
	}
	id := fmt.Sprintf("%s %s %s", m.store.KeySpace(), m.cfg.Scope, ev.Topic)
	owner, _ := scopes.LoadOrStore(id, handler)
	if owner.(string) == handler {
		return nil
	}
	return fmt.Errorf("consumer: %w: Config.Scope %q is used by handlers %q and %q on topic %q: they would skip each "+
		"other's messages; give each handler its own middleware with its own Scope "+
		"(handler.AddMiddleware), or leave Config.Scope empty to scope keys by handler name",
		dedupe.ErrMisconfigured, m.cfg.Scope, owner, handler, ev.Topic)
}

// run calls h on msg (a handlerMessage), recovering a panic into an error.
// An Ack or Nack of the handler's is noted once, at WARN.
func (m *Middleware) run(h message.HandlerFunc, msg *message.Message) (outs []*message.Message, err error) {
	if err := m.overDelivered(msg); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("consumer: handler panicked: %v\n%s", r, debug.Stack())
		}
		m.noteAck(msg)
	}()
	return h(msg)
}

// overDelivered returns a permanent error (poison) for a message that a
// Subscriber says was delivered more than twice Config.MaxAttempts times,
// by every member, its copies' deliveries included
// (dedupe.DeliveriesFromContext; a share group's), and still reaches its
// handler: the deliveries that ended in a crash count there, which this
// process's count of failures cannot see, so a handler that kills its
// process (an OOM) is dead-lettered instead of run for ever. Nil with
// MaxAttempts negative.
func (m *Middleware) overDelivered(msg *message.Message) error {
	n, ok := dedupe.DeliveriesFromContext(msg.Context())
	if !ok || m.cfg.MaxAttempts < 0 || n <= 2*m.cfg.MaxAttempts {
		return nil
	}
	return dedupe.Permanent(fmt.Errorf("consumer: %w: message %s was delivered %d times, by every member and its copies, "+
		"without being applied (more than twice Config.MaxAttempts, %d): its handler may kill its process (an OOM); dead-lettered without running it",
		dedupe.ErrPoisonMessage, msg.UUID, n, m.cfg.MaxAttempts))
}

// handlerMessage returns msg as its handler sees it: the same UUID,
// payload and metadata (one map: what the handler sets there, the
// middleware around sees), with ctx, and an Ack and a Nack of its own that
// reach nothing. Only the library acks a message it protects, after the
// commit: a handler's Ack (a habit of raw Subscriber loops) would commit
// the offset of a message whose writes its error then rolls back.
func handlerMessage(msg *message.Message, ctx context.Context) *message.Message {
	hm := message.NewMessage(msg.UUID, msg.Payload)
	hm.Metadata = msg.Metadata
	hm.SetContext(ctx)
	return hm
}

// handlerAcked reports whether the handler acked or nacked hm, a
// handlerMessage.
func handlerAcked(hm *message.Message) bool {
	select {
	case <-hm.Acked():
		return true
	case <-hm.Nacked():
		return true
	default:
		return false
	}
}

// noteAck logs, once per middleware, that a handler acked or nacked its
// message.
func (m *Middleware) noteAck(hm *message.Message) {
	if handlerAcked(hm) && m.ackNoted.CompareAndSwap(false, true) {
		m.cfg.Logger.WarnContext(hm.Context(), "consumer: the handler called Ack or Nack on its message: ignored; "+
			"the library acks a message once its transaction commits, and a handler's error has it delivered again",
			"uuid", hm.UUID)
	}
}

func (m *Middleware) handle(msg *message.Message, h message.HandlerFunc, ev *Event) ([]*message.Message, error) {
	ctx := msg.Context()
	if ctx.Value(activeKey{}) != nil {
		return nil, fmt.Errorf("consumer: %w: the dedupe middleware wraps itself (router-level and handler-level?): "+
			"the inner claim would wait for the outer one; add it once", dedupe.ErrMisconfigured)
	}
	if ev.Scope == "" {
		return nil, fmt.Errorf("consumer: %w: no scope for message %s: Config.Scope is empty and the message does not come "+
			"from a Watermill router handler: set Config.Scope to the handler's stable name", dedupe.ErrMisconfigured, msg.UUID)
	}
	if err := m.checkScope(ctx, ev); err != nil {
		return nil, err
	}
	key, keyErr := m.keyOf(msg, ev.Scope)
	if keyErr == nil {
		ev.Key = key.ID
	}
	if err := m.retriedPermanent(msg, ev); err != nil {
		return nil, err
	}
	if ctx.Value(attemptKey{}) != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("consumer: %w: message %s came back with the cancelled context of an earlier attempt (%v): "+
			"set middleware.Retry{ResetContextOnRetry: true}; %s", dedupe.ErrMisconfigured, msg.UUID, ctx.Err(), chainOrder)
	}
	if keyErr != nil {
		if m.cfg.MissingKey == Skip {
			m.cfg.Logger.WarnContext(ctx, "consumer: message without a valid key handled WITHOUT deduplication",
				"scope", ev.Scope, "uuid", msg.UUID, "topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset, "reason", keyErr)
			ev.Outcome = OutcomeSkipped
			return m.runUnprotected(msg, h)
		}
		var ik *dedupe.InvalidKeyError
		if !errors.As(keyErr, &ik) {
			keyErr = &dedupe.InvalidKeyError{Key: key, Reason: keyErr.Error()}
		}
		return nil, m.permanent(msg, ev, keyErr)
	}
	fp, err := m.cfg.FingerprintFunc(msg.Payload)
	if err != nil {
		if !errors.Is(err, dedupe.ErrInvalidPayload) {
			err = fmt.Errorf("%w: %v", dedupe.ErrInvalidPayload, err)
		}
		return nil, m.permanent(msg, ev, fmt.Errorf("consumer: fingerprint of %s: %w", key, err))
	}
	req := dedupe.Request{Key: key, Fingerprint: fp, TTL: m.cfg.TTL}
	if ev.Offset >= 0 {
		req.Source = dedupe.Source{Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset}
	}

	var outs []*message.Message
	var handlerErr error // the last handler run's own error
	var claim dedupe.Claim
	if m.cfg.Lease > 0 {
		claim, err = m.store.DoLease(ctx, req, m.cfg.Lease, func(ctx context.Context) ([]byte, error) {
			// ctx is the message's, ended if the lease cannot be kept.
			o, err := m.run(h, handlerMessage(msg, context.WithValue(ctx, activeKey{}, true)))
			if handlerErr = err; err != nil {
				return nil, err
			}
			fillOutputIDs(key, msg, o)
			outs = o
			return encodeOutputs(o)
		})
	} else {
		claim, err = m.store.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			slot := newSlot(tx, msg)
			defer slot.tx.End()
			watch := watchCut(ctx, m.pool, tx.Conn())
			o, err := m.run(h, handlerMessage(msg, context.WithValue(context.WithValue(msg.Context(), activeKey{}, true), txKey{}, slot)))
			if cut := cutBy(ctx, watch, err); cut != nil {
				err = cut
			} else if broken := slot.broken(err); broken != nil {
				err = broken
			}
			if err == nil && slot.failed.Load() {
				err = fmt.Errorf("consumer: %w: the handler of message %s failed but a middleware inside the dedupe "+
					"middleware returned success (a PoisonQueue?): its writes are rolled back; %s",
					dedupe.ErrMisconfigured, msg.UUID, chainOrder)
			}
			if handlerErr = err; err != nil {
				return nil, err
			}
			fillOutputIDs(key, msg, o)
			if m.cfg.Outputs != nil {
				if n := slot.dropped(o); n > 0 {
					return nil, errDropped(msg, n)
				}
				// The outputs leave through the outbox with this transaction;
				// the router has nothing to publish, now or for duplicates.
				return nil, m.cfg.Outputs.WriteOutputsTx(ctx, tx, o)
			}
			outs = o
			return encodeOutputs(o)
		})
	}
	ev.Attempts = claim.Record.Attempts
	if err != nil {
		if errors.Is(err, dedupe.ErrKeyReused) {
			if ferr := m.foreign(req, claim.Record); ferr != nil {
				return nil, fmt.Errorf("%w (%w)", ferr, err)
			}
		}
		return nil, m.failed(msg, ev, err, handlerErr != nil && errors.Is(err, handlerErr))
	}
	m.forget(msg, ev)
	if claim.Decision == dedupe.DecisionDuplicate {
		if err := m.foreign(req, claim.Record); err != nil {
			return nil, err
		}
		ev.Outcome = OutcomeDuplicate
		stored, err := decodeOutputs(claim.Record.Result)
		if err != nil {
			return nil, fmt.Errorf("consumer: duplicate %s: %w", key, err)
		}
		return stored, nil
	}
	ev.Outcome = OutcomeApplied
	return outs, nil
}

// foreign returns the error for a key that req's message finds applied from
// another topic than its own, unless Config.AcrossTopics allows it. A
// message or a key with no recorded topic is not judged.
func (m *Middleware) foreign(req dedupe.Request, rec dedupe.Record) error {
	if m.cfg.AcrossTopics || req.Source.Topic == "" || rec.Source.Topic == "" || rec.Source.Topic == req.Source.Topic {
		return nil
	}
	return fmt.Errorf("consumer: %w: key %s arrived on topic %q, but a message of topic %q already claimed it under "+
		"the same Config.Scope %q: consumers that share a Scope on different topics skip each other's messages as "+
		"duplicates; give each consumer its own Scope, or set Config.AcrossTopics (worker.Config.AcrossTopics) if "+
		"copies of the same commands reach this Scope on several topics on purpose; the message is held until then",
		dedupe.ErrMisconfigured, req.Key.ID, req.Source.Topic, rec.Source.Topic, req.Key.Scope)
}

// runUnprotected runs h in a transaction with no key (policy Skip).
func (m *Middleware) runUnprotected(msg *message.Message, h message.HandlerFunc) (outs []*message.Message, err error) {
	if m.cfg.Lease > 0 {
		return m.run(h, handlerMessage(msg, msg.Context()))
	}
	ctx := msg.Context()
	tx, err := m.store.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer: begin: %w", err)
	}
	defer pgtx.Rollback(ctx, tx)
	slot := newSlot(tx, msg)
	defer slot.tx.End()
	outs, err = m.run(h, handlerMessage(msg, context.WithValue(ctx, txKey{}, slot)))
	if broken := slot.broken(err); broken != nil {
		err = broken
	}
	if err != nil {
		return nil, err
	}
	if m.cfg.Outputs != nil {
		if n := slot.dropped(outs); n > 0 {
			return nil, errDropped(msg, n)
		}
		if err := m.cfg.Outputs.WriteOutputsTx(ctx, tx, outs); err != nil {
			return nil, err
		}
		outs = nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("consumer: commit: %w", err)
	}
	return outs, nil
}

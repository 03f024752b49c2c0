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
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures the Middleware. The zero value (or a nil *Config) is usable.
type Config struct {
	// Scope names the consumer in every key: a stable name, since keys must
	// survive deploys. Two handlers with different scopes each apply a
	// message once. A fixed Scope belongs to one handler per topic: a second
	// handler whose messages of the same topic reach a middleware with the
	// same Scope (a router-level middleware with two handlers, say) is
	// refused with an error wrapping dedupe.ErrMisconfigured, since the two
	// would skip each other's messages. Defaults to the Watermill handler's
	// name, which is per handler by construction.
	Scope string
	// AcrossTopics lets the scope's keys span topics: a message whose key
	// was applied from another topic is then a duplicate. Defaults to
	// false: such a message is held (not applied, not committed, not
	// dead-lettered, delivered again) with an error wrapping
	// dedupe.ErrMisconfigured that names Scope and both topics, and logged
	// at ERROR, since two consumers that share a Scope on different topics
	// would skip each other's messages as duplicates. Set it only when
	// copies of the same commands reach this scope on several topics on
	// purpose: a topic moved to a new one (more partitions, say) whose
	// consumers keep the Scope, so that what was applied from the old
	// topic is not applied again from the new. Consumer groups do not
	// matter: a new group on the same topic with the same Scope skips what
	// the old one applied, which is what a group's move needs.
	AcrossTopics bool
	// KeyFunc extracts the idempotency key. Defaults to KeyFromUUID.
	KeyFunc KeyFunc
	// FingerprintFunc fingerprints the payload, to catch a key reused with
	// another payload. Defaults to dedupe.RawFingerprint (SHA-256 of the
	// bytes as delivered); dedupe.JSONFingerprint suits producers whose JSON
	// serialisation is not stable.
	FingerprintFunc dedupe.FingerprintFunc
	// MissingKey is the policy for a missing or invalid key. Defaults to Reject.
	MissingKey MissingKeyPolicy
	// TTL overrides the store's key TTL for this handler when positive.
	// Defaults to the store's (7 days unless configured).
	TTL time.Duration
	// Lease switches to lease mode for handlers whose effects leave the
	// database: the key is claimed and committed first with this lease, the
	// handler runs with no transaction, and the key is completed after it.
	// Defaults to 0: transactional mode.
	Lease time.Duration
	// Outputs, when set, receives the handler's output messages in the
	// handler's transaction (a transactional outbox) instead of the router
	// publishing them; duplicates then return nothing to publish, since the
	// first run's outputs are already in the outbox. Transactional mode only.
	// Register the handler with router.AddHandler: AddConsumerHandler
	// discards a handler's outputs before any middleware sees them, and a
	// TxHandler whose outputs do not reach the middleware fails its message
	// with an error wrapping dedupe.ErrMisconfigured (its writes rolled
	// back, the message held) rather than commit it without them; a
	// handler that takes its transaction with TxFromContext is not
	// checked. Defaults to nil: outputs go back to the router.
	Outputs OutputsWriter
	// MaxAttempts bounds how often a message may fail because of itself
	// (its handler returns an error or panics while the database answers)
	// before the middleware gives up on it with an error wrapping
	// dedupe.ErrPoisonMessage, which dedupe.IsPermanent reports, so that the
	// PoisonQueue dead-letters it with its last error. Every attempt counts,
	// in-process retries (middleware.Retry) and redeliveries alike; the
	// count lives in the process and starts again after a restart. Failures
	// of the infrastructure never count, nor does an attempt cut by its
	// deadline while its handler waited for the database (a lock another
	// session holds, the disk); one cut while its handler ran the message's
	// own work does (see the package doc). Negative means never give up.
	// Defaults to 10.
	MaxAttempts int
	// Hooks receives an Event per message. Defaults to none.
	Hooks Hooks
	// LogDuplicates logs each duplicate at INFO. A replay redelivers whole
	// topics, so duplicates are many and expected; Hooks count them.
	// Defaults to false: duplicates are logged at DEBUG.
	LogDuplicates bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Source returns the Kafka coordinates of a message, recorded with its
	// key and reported in Events and logs. Defaults to
	// [dedupe.SourceFromContext] on the message's context, where
	// kafkapubsub.Subscriber puts them. With another Pub/Sub, return its
	// coordinates here (watermill-kafka, for one, keeps the partition and
	// offset in the message context: kafka.MessagePartitionFromCtx and
	// kafka.MessagePartitionOffsetFromCtx).
	Source func(msg *message.Message) (dedupe.Source, bool)
}

// OutputsWriter stores a handler's output messages in its transaction.
// outbox.Writer implements it.
type OutputsWriter interface {
	WriteOutputsTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
}

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

// msgState is what the middleware remembers of a message that failed.
type msgState struct {
	failures  int // attempts that failed because of the message
	permanent int // permanent errors returned for it
	// last is the delivery that got the last permanent error, lastErr;
	// retried counts the times that delivery came back.
	last    weak.Pointer[message.Message]
	lastErr error
	retried int
}

// maxTracked bounds the failing messages remembered; each partition has
// few in flight, so this is only reached when partitions move away.
const maxTracked = 10000

// NewMiddleware returns the middleware on store: a [*pgstore.Store], or
// consumertest.MemStore in unit tests.
func NewMiddleware(store Store, cfg *Config) (*Middleware, error) {
	if ps, ok := store.(*pgstore.Store); store == nil || (ok && ps == nil) {
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

type txKey struct{}

// txSlot is the message's transaction as handed to its handler: it serves
// one TxHandler call, and remembers that call's failure or outputs.
type txSlot struct {
	tx     pgx.Tx
	calls  atomic.Int32
	failed atomic.Bool
	outs   atomic.Pointer[[]*message.Message]
}

// dropped returns how many of the outputs that the TxHandler returned on
// slot are not among got, the outputs that reached the middleware.
func (slot *txSlot) dropped(got []*message.Message) int {
	p := slot.outs.Load()
	if p == nil || len(*p) == 0 {
		return 0
	}
	seen := make(map[string]bool, len(got))
	for _, m := range got {
		if m != nil {
			seen[m.UUID] = true
		}
	}
	n := 0
	for _, m := range *p {
		if m != nil && !seen[m.UUID] {
			n++
		}
	}
	return n
}

// errDropped is the error for outputs that did not reach Config.Outputs.
func errDropped(msg *message.Message, n int) error {
	return fmt.Errorf("consumer: %w: the handler of message %s returned %d output messages that never reached the "+
		"dedupe middleware, so Config.Outputs cannot write them to the outbox; nothing is committed: register the "+
		"handler with router.AddHandler (router.AddConsumerHandler discards a handler's outputs), and let no "+
		"middleware between the dedupe middleware and the handler drop them", dedupe.ErrMisconfigured, msg.UUID, n)
}

// TxFromContext returns the transaction the middleware opened for the
// message whose context is ctx (transactional mode). Prefer TxHandler: it
// also refuses a second run of the handler on the same transaction.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	slot, ok := ctx.Value(txKey{}).(*txSlot)
	if !ok {
		return nil, false
	}
	return slot.tx, true
}

// Tx returns the message's transaction: TxFromContext(msg.Context()).
func Tx(msg *message.Message) (pgx.Tx, bool) { return TxFromContext(msg.Context()) }

// TxHandlerFunc is a handler that takes the middleware's transaction.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)

// ErrNoTx is returned by a TxHandler run without the middleware (or in lease mode).
var ErrNoTx = errors.New("consumer: no transaction in the message context: add the exactly middleware in transactional mode")

// chainOrder names the order that fixes every chain trap.
const chainOrder = "add middleware in the order PoisonQueue, Retry if any (with ShouldRetry and ResetContextOnRetry), " +
	"Timeout, the dedupe middleware, Recoverer"

// TxHandler adapts fn to a Watermill handler; the middleware must wrap it.
// The transaction serves one call: a middleware between the dedupe
// middleware and the handler that runs the handler again (Retry) or turns
// its error into success (PoisonQueue) would apply the first attempt's
// writes with the second's, so the second call fails, and a swallowed
// error rolls the transaction back, with an error wrapping
// dedupe.ErrMisconfigured that names the right order. It also tells the
// middleware what fn returned, so that outputs dropped on their way to
// Config.Outputs (a registration with router.AddConsumerHandler) fail the
// message instead of committing it without them.
func TxHandler(fn TxHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		slot, ok := msg.Context().Value(txKey{}).(*txSlot)
		if !ok {
			return nil, ErrNoTx
		}
		if slot.calls.Add(1) > 1 {
			return nil, fmt.Errorf("consumer: %w: the handler of message %s ran twice on one transaction, "+
				"on top of the first attempt's writes: a Retry sits inside the dedupe middleware; %s",
				dedupe.ErrMisconfigured, msg.UUID, chainOrder)
		}
		outs, err := fn(msg.Context(), slot.tx, msg)
		if err != nil {
			slot.failed.Store(true)
		} else {
			slot.outs.Store(&outs)
		}
		return outs, err
	}
}

// ShouldRetry is for middleware.Retry's ShouldRetry: it does not retry
// permanent errors, which no retry can fix, nor configuration errors.
func ShouldRetry(p middleware.RetryParams) bool {
	return !dedupe.IsPermanent(p.Err) && !errors.Is(p.Err, dedupe.ErrMisconfigured)
}

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

func outcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, dedupe.ErrMisconfigured):
		return OutcomeMisconfigured
	case errors.Is(err, dedupe.ErrKeyReused):
		return OutcomeKeyReused
	case errors.Is(err, dedupe.ErrInFlight):
		return OutcomeInFlight
	case errors.Is(err, dedupe.ErrInvalidKey):
		return OutcomeInvalidKey
	case errors.Is(err, dedupe.ErrInvalidPayload):
		return OutcomeInvalidPayload
	case errors.Is(err, dedupe.ErrResultTooLarge):
		return OutcomeResultTooLarge
	case errors.Is(err, dedupe.ErrPoisonMessage):
		return OutcomePoisoned
	case dedupe.IsPermanent(err):
		return OutcomeRejected
	}
	return OutcomeFailed
}

// log writes one line per message, at the outcome's level.
func (m *Middleware) log(ctx context.Context, msg *message.Message, ev Event) {
	level, text := slog.LevelDebug, "consumer: message applied"
	switch ev.Outcome {
	case OutcomeDuplicate:
		level, text = slog.LevelDebug, "consumer: duplicate: the handler did not run again"
		if m.cfg.LogDuplicates {
			level = slog.LevelInfo
		}
	case OutcomeInFlight:
		level, text = slog.LevelInfo, "consumer: key in flight on another worker: the message will be delivered again"
	case OutcomeKeyReused:
		level, text = slog.LevelWarn, "consumer: key reused with another payload: not applied, for the dead-letter topic"
	case OutcomeInvalidKey:
		level, text = slog.LevelWarn, "consumer: invalid key: not applied, for the dead-letter topic"
	case OutcomeInvalidPayload:
		level, text = slog.LevelWarn, "consumer: invalid payload: not applied, for the dead-letter topic"
	case OutcomeRejected:
		level, text = slog.LevelWarn, "consumer: rejected by the handler (dedupe.Permanent): rolled back, for the dead-letter topic"
	case OutcomeResultTooLarge:
		level, text = slog.LevelWarn, "consumer: result over the store's limit: rolled back, for the dead-letter topic"
	case OutcomePoisoned:
		level, text = slog.LevelError, "consumer: poison message: it failed on every attempt; rolled back, for the dead-letter topic"
	case OutcomeFailed:
		level, text = slog.LevelWarn, "consumer: handler failed: rolled back, the message will be retried"
	case OutcomeUnavailable:
		level, text = slog.LevelWarn, "consumer: database unavailable: rolled back, the message will be retried"
	case OutcomeMisconfigured:
		level, text = slog.LevelError, "consumer: configuration error: the message is retried until it is fixed"
	case OutcomeSkipped:
		return // logged at WARN where it happens
	}
	if !m.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs := []any{"key", ev.Key, "scope", ev.Scope, "topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset,
		"uuid", msg.UUID, "outcome", string(ev.Outcome), "attempts", ev.Attempts, "duration", ev.Duration}
	if ev.Err != nil {
		attrs = append(attrs, "err", ev.Err)
	}
	m.cfg.Logger.Log(ctx, level, text, attrs...)
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
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("consumer: handler panicked: %v\n%s", r, debug.Stack())
		}
		m.noteAck(msg)
	}()
	return h(msg)
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
			o, err := m.run(h, handlerMessage(msg, context.WithValue(msg.Context(), activeKey{}, true)))
			if handlerErr = err; err != nil {
				return nil, err
			}
			fillOutputIDs(key, msg, o)
			outs = o
			return encodeOutputs(o)
		})
	} else {
		claim, err = m.store.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			slot := &txSlot{tx: tx}
			watch := watchCut(ctx, m.pool, tx.Conn())
			o, err := m.run(h, handlerMessage(msg, context.WithValue(context.WithValue(msg.Context(), activeKey{}, true), txKey{}, slot)))
			if cut := cutBy(ctx, watch, err); cut != nil {
				err = cut
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

// identity names a message for the failure counts: its key and where it
// came from, which its redeliveries share.
func identity(msg *message.Message, ev *Event) string {
	return fmt.Sprintf("%s/%s %s/%d/%d %s", ev.Scope, ev.Key, ev.Topic, ev.Partition, ev.Offset, msg.UUID)
}

// state returns the message's record, creating it; m.mu held.
func (m *Middleware) state(id string) *msgState {
	st := m.messages[id]
	if st == nil {
		if len(m.messages) >= maxTracked {
			for k := range m.messages { // forget one at random
				delete(m.messages, k)
				break
			}
		}
		st = &msgState{}
		m.messages[id] = st
	}
	return st
}

func (m *Middleware) forget(msg *message.Message, ev *Event) {
	m.mu.Lock()
	delete(m.messages, identity(msg, ev))
	m.mu.Unlock()
}

// permanent records a permanent error for the message. One that comes back
// after a permanent error was not dead-lettered: the PoisonQueue is missing,
// filters it out, or cannot publish (a dead-letter topic that does not
// exist). That is logged at ERROR with the fix; the message stays where it is.
func (m *Middleware) permanent(msg *message.Message, ev *Event, err error) error {
	m.mu.Lock()
	st := m.state(identity(msg, ev))
	st.permanent++
	n := st.permanent
	st.last, st.lastErr, st.retried = weak.Make(msg), err, 0
	m.mu.Unlock()
	if n > 1 {
		m.cfg.Logger.ErrorContext(msg.Context(), "consumer: a message with a permanent error came back: it was not dead-lettered; "+
			"check that the dead-letter topic exists and that middleware.PoisonQueueWithFilter(pub, topic, dedupe.IsPermanent) "+
			"is the outermost middleware", "key", ev.Key, "scope", ev.Scope, "topic", ev.Topic, "partition", ev.Partition,
			"offset", ev.Offset, "uuid", msg.UUID, "times", n, "err", err)
	}
	return err
}

// retriedPermanent answers a delivery that comes back to the middleware
// after a permanent error, the same *message.Message, so in process: a
// middleware.Retry without ShouldRetry retries every error. No retry can
// fix a permanent error, so it is returned again at once (neither the
// claim nor the handler run again), with the fix, for the PoisonQueue to
// dead-letter after the Retry gives up; the first time it is logged at
// ERROR with the fix. It returns nil for any other attempt.
func (m *Middleware) retriedPermanent(msg *message.Message, ev *Event) error {
	m.mu.Lock()
	st := m.messages[identity(msg, ev)]
	if st == nil || st.lastErr == nil || st.last.Value() != msg {
		m.mu.Unlock()
		return nil
	}
	st.retried++
	n, last := st.retried, st.lastErr
	m.mu.Unlock()
	if n == 1 {
		m.cfg.Logger.ErrorContext(msg.Context(), "consumer: a permanent error was retried in process: "+
			"the middleware.Retry has no ShouldRetry; set middleware.Retry{ShouldRetry: consumer.ShouldRetry} "+
			"(the message is dead-lettered once the Retry gives up)", "key", ev.Key, "scope", ev.Scope,
			"topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset, "uuid", msg.UUID, "err", last)
	}
	return fmt.Errorf("consumer: message %s was retried in process after a permanent error, which no retry can fix "+
		"(set middleware.Retry{ShouldRetry: consumer.ShouldRetry}): %w", msg.UUID, last)
}

// failed classifies a failed attempt. A configuration error and a failure
// of the infrastructure (the database or its connection) never count
// against the message; the handler's own failure does, while the database
// answers, and after Config.MaxAttempts of them the message is poison.
func (m *Middleware) failed(msg *message.Message, ev *Event, err error, ownErr bool) error {
	switch {
	case errors.Is(err, dedupe.ErrMisconfigured):
		return err
	case pgstore.IsConfigurationError(err):
		return fmt.Errorf("consumer: %w: the handler's SQL names a table, column or schema that is not there "+
			"(run the service's migrations, or schema-qualify the name): %w", dedupe.ErrMisconfigured, err)
	case dedupe.IsPermanent(err):
		return m.permanent(msg, ev, err)
	case errors.Is(err, dedupe.ErrInFlight):
		return err
	}
	var cut *cutError
	switch {
	case errors.As(err, &cut) && cut.wait != waitMessage:
		// Cut while waiting for the database (or not known): not the
		// message's fault.
		ev.Outcome = OutcomeUnavailable
		return err
	case cut != nil:
		// Cut while running its own work: counted, whatever the error
		// the cut left (a cancelled statement's, say).
	case !ownErr && errors.Is(msg.Context().Err(), context.DeadlineExceeded):
		// Cut outside the handler (the claim, the commit): not the
		// message's.
		ev.Outcome = OutcomeUnavailable
		return err
	case m.unavailable(msg.Context(), err):
		ev.Outcome = OutcomeUnavailable
		return err
	}
	if !ownErr || m.cfg.MaxAttempts < 0 {
		return err
	}
	m.mu.Lock()
	st := m.state(identity(msg, ev))
	st.failures++
	n := st.failures
	m.mu.Unlock()
	if n < m.cfg.MaxAttempts {
		return err
	}
	return m.permanent(msg, ev, fmt.Errorf("consumer: %w: %d attempts of %s failed while the database answered; the last: %w",
		dedupe.ErrPoisonMessage, n, identity(msg, ev), err))
}

// unavailable reports whether err is, or came with, a failure of the
// infrastructure: a transient database error, a lost connection, a shutdown
// (the message's context cancelled), an error the handler marked with
// dedupe.Retryable, or a database that does not answer a ping now.
func (m *Middleware) unavailable(ctx context.Context, err error) bool {
	if dedupe.IsRetryable(err) || pgstore.IsRetryableError(err) || errors.Is(err, context.Canceled) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57", "58", "XX": // connection, resources, operator, system, internal
			return true
		}
		return false // the server answered: the database is there
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
	defer cancel()
	return m.store.Ping(pctx) != nil
}

// pingTimeout bounds the ping that tells a failing message from a database
// that does not answer.
const pingTimeout = 2 * time.Second

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
	slot := &txSlot{tx: tx}
	if outs, err = m.run(h, handlerMessage(msg, context.WithValue(ctx, txKey{}, slot))); err != nil {
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

package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures the Middleware. The zero value (or a nil *Config) is usable.
type Config struct {
	// Scope names the consumer in every key: a stable name, since keys must
	// survive deploys. Two handlers with different scopes each apply a
	// message once. Defaults to the Watermill handler's name.
	Scope string
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
	// discards a handler's outputs before any middleware sees them.
	// Defaults to nil: outputs go back to the router.
	Outputs OutputsWriter
	// Hooks receives an Event per message. Defaults to none.
	Hooks Hooks
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// OutputsWriter stores a handler's output messages in its transaction.
// outbox.Writer implements it.
type OutputsWriter interface {
	WriteOutputsTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
}

// Middleware is the effectively-once Watermill middleware. For each message
// it opens a transaction, claims the message's key, runs the handler with
// that transaction (TxFromContext, or a TxHandler), stores the handler's
// output messages as the key's result and commits — before the router acks
// the message, so the Kafka offset moves only after the effects are durable.
//
// A duplicate does not run the handler: the stored outputs are returned, so
// the router re-publishes them with their original UUIDs. A key reused with
// another payload, an invalid key (policy Reject) and an invalid payload are
// permanent errors (dedupe.IsPermanent) for a PoisonQueue to dead-letter.
// A handler error rolls back the handler's writes and the key: the router
// nacks and the message is applied on a later delivery, once.
type Middleware struct {
	store *pgstore.Store
	cfg   Config
}

// NewMiddleware returns the middleware on store.
func NewMiddleware(store *pgstore.Store, cfg *Config) (*Middleware, error) {
	if store == nil {
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
	return &Middleware{store: store, cfg: c}, nil
}

type txKey struct{}

// TxFromContext returns the transaction the middleware opened for the
// message whose context is ctx (transactional mode).
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Tx returns the message's transaction: TxFromContext(msg.Context()).
func Tx(msg *message.Message) (pgx.Tx, bool) { return TxFromContext(msg.Context()) }

// TxHandlerFunc is a handler that takes the middleware's transaction.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)

// ErrNoTx is returned by a TxHandler run without the middleware (or in lease mode).
var ErrNoTx = errors.New("consumer: no transaction in the message context: add the exactly middleware in transactional mode")

// TxHandler adapts fn to a Watermill handler; the middleware must wrap it.
func TxHandler(fn TxHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := Tx(msg)
		if !ok {
			return nil, ErrNoTx
		}
		return fn(msg.Context(), tx, msg)
	}
}

// ShouldRetry is for middleware.Retry's ShouldRetry: it does not retry
// permanent errors, which no retry can fix.
func ShouldRetry(p middleware.RetryParams) bool { return !dedupe.IsPermanent(p.Err) }

// Middleware wraps h. Use it as a router or handler middleware.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		ev := Event{Scope: m.cfg.Scope, Offset: -1}
		if ev.Scope == "" {
			ev.Scope = message.HandlerNameFromCtx(msg.Context())
		}
		if topic, p, o, ok := Source(msg); ok {
			ev.Topic, ev.Partition, ev.Offset = topic, p, o
		}
		outs, err := m.handle(msg, h, &ev)
		ev.Err, ev.Duration = err, time.Since(start)
		if ev.Outcome == "" {
			ev.Outcome = outcomeOf(err)
		}
		if m.cfg.Hooks != nil {
			m.cfg.Hooks.OnMessage(msg.Context(), ev)
		}
		return outs, err
	}
}

func outcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, dedupe.ErrKeyReused):
		return OutcomeKeyReused
	case errors.Is(err, dedupe.ErrInFlight):
		return OutcomeInFlight
	case errors.Is(err, dedupe.ErrInvalidKey):
		return OutcomeInvalidKey
	}
	return OutcomeFailed
}

func (m *Middleware) handle(msg *message.Message, h message.HandlerFunc, ev *Event) ([]*message.Message, error) {
	ctx := msg.Context()
	id, keyErr := m.cfg.KeyFunc(msg)
	key := dedupe.Key{Scope: ev.Scope, ID: id}
	if keyErr == nil {
		keyErr = key.Validate()
	}
	if keyErr != nil {
		switch m.cfg.MissingKey {
		case Skip:
			m.cfg.Logger.WarnContext(ctx, "consumer: message without a valid key handled WITHOUT deduplication",
				"scope", ev.Scope, "uuid", msg.UUID, "topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset, "reason", keyErr)
			ev.Outcome = OutcomeSkipped
			return m.runUnprotected(msg, h)
		case Derive:
			if id, err := KeyFromOffset(msg); err == nil {
				key.ID = id
				keyErr = key.Validate()
			}
		}
		if keyErr != nil {
			var ik *dedupe.InvalidKeyError
			if !errors.As(keyErr, &ik) {
				keyErr = &dedupe.InvalidKeyError{Key: key, Reason: keyErr.Error()}
			}
			return nil, keyErr
		}
	}
	ev.Key = key.ID
	fp, err := m.cfg.FingerprintFunc(msg.Payload)
	if err != nil {
		if !errors.Is(err, dedupe.ErrInvalidPayload) {
			err = fmt.Errorf("%w: %v", dedupe.ErrInvalidPayload, err)
		}
		return nil, fmt.Errorf("consumer: fingerprint of %s: %w", key, err)
	}
	req := dedupe.Request{Key: key, Fingerprint: fp, TTL: m.cfg.TTL}
	if ev.Offset >= 0 {
		req.Source = dedupe.Source{Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset}
	}

	var outs []*message.Message
	var claim dedupe.Claim
	if m.cfg.Lease > 0 {
		claim, err = m.store.DoLease(ctx, req, m.cfg.Lease, func(ctx context.Context) ([]byte, error) {
			o, err := h(msg)
			if err != nil {
				return nil, err
			}
			outs = o
			return encodeOutputs(o)
		})
	} else {
		claim, err = m.store.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			orig := msg.Context()
			msg.SetContext(context.WithValue(orig, txKey{}, tx))
			defer msg.SetContext(orig)
			o, err := h(msg)
			if err != nil {
				return nil, err
			}
			if m.cfg.Outputs != nil {
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
		return nil, err
	}
	if claim.Outcome == dedupe.OutcomeDuplicate {
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

// runUnprotected runs h in a transaction with no key (policy Skip).
func (m *Middleware) runUnprotected(msg *message.Message, h message.HandlerFunc) (outs []*message.Message, err error) {
	if m.cfg.Lease > 0 {
		return h(msg)
	}
	ctx := msg.Context()
	tx, err := m.store.Pool().Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer: begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	orig := msg.Context()
	msg.SetContext(context.WithValue(orig, txKey{}, tx))
	defer msg.SetContext(orig)
	if outs, err = h(msg); err != nil {
		return nil, err
	}
	if m.cfg.Outputs != nil {
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

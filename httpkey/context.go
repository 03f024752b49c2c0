package httpkey

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

type ctxKey struct{}

// state is what a handler behind the middleware finds in its context.
type state struct {
	tx  pgx.Tx
	key string
	m   *Middleware
}

func withState(ctx context.Context, s *state) context.Context {
	return context.WithValue(ctx, ctxKey{}, s)
}

func stateOf(ctx context.Context) *state {
	s, _ := ctx.Value(ctxKey{}).(*state)
	return s
}

// Tx returns the transaction that holds the request's key, in which the
// handler writes: it commits with the key when the response is kept, and
// rolls back with it otherwise. It is nil outside the middleware and in
// lease mode. The handler must not commit or roll it back.
func Tx(ctx context.Context) pgx.Tx {
	if s := stateOf(ctx); s != nil {
		return s.tx
	}
	return nil
}

// Key returns the request's idempotency key (as the client sent it,
// unscoped), for example to pass on to a provider that takes its own
// idempotency keys; false outside the middleware or without a key.
func Key(ctx context.Context) (string, bool) {
	if s := stateOf(ctx); s != nil && s.key != "" {
		return s.key, true
	}
	return "", false
}

// ErrNoOutbox is WriteOutbox's error outside a transaction of the
// middleware, or when Config.Outbox is nil.
var ErrNoOutbox = errors.New("httpkey: no outbox here: WriteOutbox needs Config.Outbox and a handler in transactional mode")

// WriteOutbox writes msgs for topic to the outbox in the request's
// transaction (see [outbox.Writer.WriteTx]): they are published after,
// and only if, the response is kept and committed with the key.
func WriteOutbox(ctx context.Context, topic string, msgs ...*message.Message) error {
	s := stateOf(ctx)
	if s == nil || s.tx == nil || s.m.cfg.Outbox == nil {
		return ErrNoOutbox
	}
	return s.m.cfg.Outbox.WriteTx(ctx, s.tx, topic, msgs...)
}

package httpkey

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/msgid"
	"github.com/exactly-go/exactly/internal/txguard"
)

type ctxKey struct{}

// state is what a handler behind the middleware finds in its context.
type state struct {
	tx       pgx.Tx
	key      string
	scopedID string // the key as stored: principal and key
	m        *Middleware

	mu  sync.Mutex
	ids int // the message IDs minted so far

	wrote *atomic.Bool // the request's: set by WriteOutbox
}

// nextID returns the request's next message ID (see MessageID).
func (s *state) nextID() (string, bool) {
	if s.scopedID == "" {
		return "", false
	}
	s.mu.Lock()
	i := s.ids
	s.ids++
	s.mu.Unlock()
	return msgid.DeriveRequest(s.m.cfg.Scope, s.scopedID, s.key, i), true
}

// MessageID returns a message ID for the request's next message (a
// command it sends, an event it writes with WriteOutbox): the n-th call in
// a request gets a UUIDv7 that is a pure function of the middleware's
// Scope, the principal, the Idempotency-Key and n. So when the request is
// applied again — the database was restored to before its commit, and the
// client retried with its key — its messages get the IDs they had, and the
// consumers downstream find them duplicates. Its time bits are those of
// the key when the key is itself a UUIDv7 (as a client should mint it:
// the IDs are then time-ordered in a downstream key store), else the Unix
// epoch's, which a partitioned key store files with the keys older than
// its partitions. false outside the middleware or without a key.
func MessageID(ctx context.Context) (string, bool) {
	if s := stateOf(ctx); s != nil {
		return s.nextID()
	}
	return "", false
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
// lease mode. Its Commit and Rollback return an error (so does SQL that
// ends it): a handler that calls them gets 500 handler-ended-transaction,
// and nothing is applied. A statement that may fail (a unique violation
// the handler answers with 409) runs in a savepoint (tx.Begin); a 4xx
// answered after a failed statement outside one is stored with the key
// all the same, without the handler's writes. On a [*pgstore.Store] in
// transactional mode it is the store's own transaction, as
// pgstore.Store.Do's is (its BEGIN went out in one round trip with the
// key's lock and claim): LargeObjects is not supported on it.
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
// and only if, the response is kept and committed with the key. A message
// without a UUID gets the request's next MessageID, so the same request
// applied again emits it under the same ID.
func WriteOutbox(ctx context.Context, topic string, msgs ...*message.Message) error {
	s := stateOf(ctx)
	if s == nil || s.tx == nil || s.m.cfg.Outbox == nil {
		return ErrNoOutbox
	}
	if s.wrote != nil {
		s.wrote.Store(true)
	}
	for _, m := range msgs {
		if m != nil && m.UUID == "" {
			if id, ok := s.nextID(); ok {
				m.UUID = id
			}
		}
	}
	return s.m.cfg.Outbox.WriteTx(ctx, txguard.Unwrap(s.tx), topic, msgs...)
}

package consumer

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

// Store is the key store the [Middleware] runs on. [*pgstore.Store]
// implements it; consumertest.MemStore implements it in memory, for unit
// tests of handlers that write no SQL.
type Store interface {
	// Do runs fn at most once for req.Key, in a transaction that holds the
	// key's claim, and commits the key with fn's writes ([pgstore.Store.Do]).
	Do(ctx context.Context, req dedupe.Request, fn pgstore.TxFunc) (dedupe.Claim, error)
	// DoLease runs fn at most once at a time for req.Key under a lease and
	// completes the key after it ([pgstore.Store.DoLease]).
	DoLease(ctx context.Context, req dedupe.Request, lease time.Duration, fn pgstore.LeaseFunc) (dedupe.Claim, error)
	// Begin opens a transaction that claims no key, for a message handled
	// without deduplication (MissingKey policy Skip).
	Begin(ctx context.Context) (pgx.Tx, error)
	// Ping reports whether the database answers. The middleware asks after
	// a failed attempt, to tell a failing message from an unavailable
	// database.
	Ping(ctx context.Context) error
	// Check verifies at start-up what the store needs (its table).
	Check(ctx context.Context) error
	// KeySpace names where the store keeps its keys: stores with the same
	// KeySpace share keys. A fixed Config.Scope is bound to one handler per
	// KeySpace and topic.
	KeySpace() string
}

var _ Store = (*pgstore.Store)(nil)

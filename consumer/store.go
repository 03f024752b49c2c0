package consumer

import (
	"context"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// Store is the key store the [Middleware] runs on. [*pgstore.Store]
// implements it; consumertest.MemStore implements it in memory, for unit
// tests of handlers that write no SQL.
type Store interface {
	// Do runs fn at most once for req.Key, in a transaction that holds the
	// key's claim, and commits the key with fn's writes ([pgstore.Store.Do]).
	Do(ctx context.Context, req dedupe.Request, fn func(ctx context.Context, tx pgx.Tx) (result []byte, err error)) (dedupe.Claim, error)
	// DoLease runs fn at most once at a time for req.Key under a lease and
	// completes the key after it ([pgstore.Store.DoLease]).
	DoLease(ctx context.Context, req dedupe.Request, lease time.Duration, fn func(ctx context.Context) (result []byte, err error)) (dedupe.Claim, error)
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

// BatchStore is the key store the [BatchConsumer] runs on: a [Store] that
// also claims a batch's keys in one transaction. [*pgstore.Store]
// implements it; consumertest.MemStore implements it in memory, for unit
// tests of batch handlers that write no SQL.
type BatchStore interface {
	Store
	// DoBatch begins a transaction, claims every key of reqs, runs fn once
	// with the indexes of the fresh requests (in the ctx that
	// [dedupe.BatchClaimsFromContext] reads, the claims as decided), stores
	// fn's results with their keys and commits; the answer has one
	// [dedupe.BatchClaim] per request, in reqs' order
	// ([pgstore.Store.DoBatch]). An error from fn rolls everything back and
	// is returned as is.
	DoBatch(ctx context.Context, reqs []dedupe.Request,
		fn func(ctx context.Context, tx pgx.Tx, fresh []int) (results [][]byte, err error)) ([]dedupe.BatchClaim, error)
}

// isNil reports whether s is nil, or a nil pointer in an interface (a
// *pgstore.Store declared and never set).
func isNil(s Store) bool {
	if s == nil {
		return true
	}
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

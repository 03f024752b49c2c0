package httpkey

import (
	"context"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// DBTX is what [Store.GetTx] reads on: a pool, a connection or a
// transaction. It is the method set of pgstore.DBTX, and an alias of it as
// that one is, so that [*pgstore.Store] implements [Store].
type DBTX = interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the key store the [Middleware] keeps its keys in.
// [*pgstore.Store] implements it; consumertest.MemStore implements it in
// memory, for unit tests of HTTP handlers that write no SQL.
//
// A store that also has a method Pool() *pgxpool.Pool (pgstore.Store
// does) lets the middleware watch Config.Outbox's backlog
// (Config.StaleOutbox) on that pool.
type Store interface {
	// Check verifies what the store needs (its table); the middleware runs
	// it once, before the first request's transaction.
	Check(ctx context.Context) error
	// Begin opens a transaction that claims no key yet.
	Begin(ctx context.Context) (pgx.Tx, error)
	// TryLockKeyTx takes key's lock in tx without waiting, held until tx
	// ends, and reports false when another transaction holds it
	// ([pgstore.Store.TryLockKeyTx]): a request in transactional mode
	// takes it before it claims its key, so that a second request with the
	// key answers at once (409, or the stored response) instead of waiting
	// for the first.
	TryLockKeyTx(ctx context.Context, tx pgx.Tx, key dedupe.Key) (bool, error)
	// ClaimTx claims req.Key in tx ([dedupe.Store.ClaimTx]).
	ClaimTx(ctx context.Context, tx pgx.Tx, req dedupe.Request) (dedupe.Claim, error)
	// CompleteTx stores result with c's key in tx ([dedupe.Store.CompleteTx]).
	CompleteTx(ctx context.Context, tx pgx.Tx, c dedupe.Claim, result []byte) error
	// GetTx reads key's record on db, an error wrapping
	// [dedupe.ErrNotFound] when there is none ([pgstore.Store.GetTx]).
	GetTx(ctx context.Context, db DBTX, key dedupe.Key) (dedupe.Record, error)
	// Do runs fn at most once for req.Key, in a transaction that holds the
	// key's claim, and commits the key with fn's writes
	// ([pgstore.Store.Do]). A claim of a key that an open transaction holds
	// waits for that transaction to end.
	Do(ctx context.Context, req dedupe.Request, fn func(ctx context.Context, tx pgx.Tx) (result []byte, err error)) (dedupe.Claim, error)
	// DoLease runs fn at most once at a time for req.Key under a lease and
	// completes the key after it ([pgstore.Store.DoLease]).
	DoLease(ctx context.Context, req dedupe.Request, lease time.Duration, fn func(ctx context.Context) (result []byte, err error)) (dedupe.Claim, error)
	// MaxResultBytes is the largest result the store keeps with a key: a
	// stored response must fit it once encoded.
	MaxResultBytes() int
}

// pipelined is a store that begins a request's transaction, takes its
// key's lock and claims the key in one round trip, and stores the response
// with the COMMIT in one more ([pgstore.Store.BeginLockClaimTx],
// [pgstore.Store.CompleteCommitTx]): transactional mode then costs the
// round trips of the handler's own transaction. Other stores take a round
// trip for each step.
type pipelined interface {
	pooled
	// BeginLockClaimTx is Begin, TryLockKeyTx and, when it took the lock,
	// ClaimTx; a lock held elsewhere rolls the transaction back (tx nil,
	// locked false).
	BeginLockClaimTx(ctx context.Context, req dedupe.Request) (tx pgx.Tx, locked bool, c dedupe.Claim, err error)
	// CompleteCommitTx is CompleteTx and Commit.
	CompleteCommitTx(ctx context.Context, tx pgx.Tx, c dedupe.Claim, result []byte) error
}

// pooled is a store whose keys are on a Postgres pool.
type pooled interface {
	Pool() *pgxpool.Pool
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

package consumertest

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/txguard"
)

// ErrNoSQL is returned by every SQL method of a MemStore transaction.
var ErrNoSQL = errors.New("consumertest: a MemStore transaction runs no SQL: " +
	"test a handler that writes SQL on a pgstore.Store (consumertest.NewHandler(pgstoreStore, ...))")

// Tx is a [MemStore] transaction, the [pgx.Tx] that a handler gets from the
// middleware on a MemStore. What it supports:
//
//   - Commit commits the keys claimed in it and runs the OnCommit functions;
//     Rollback drops them. After either, both return [pgx.ErrTxClosed], as
//     pgx's do. Committed and RolledBack report which one ended it.
//   - Exec, Query, QueryRow (its Scan), SendBatch (its results), CopyFrom,
//     Prepare and Begin (a savepoint) run no SQL: they return [ErrNoSQL].
//   - LargeObjects returns the zero pgx.LargeObjects, which panics when
//     used; Conn returns nil.
type Tx struct {
	mem *dedupetest.MemTx

	mu       sync.Mutex
	ended    bool
	commit   bool
	onCommit []func()
}

var _ pgx.Tx = (*Tx)(nil)

// TxOf returns the MemStore transaction behind tx, the transaction a
// handler gets on a MemStore (the middleware hands handlers a view of its
// transaction that refuses Commit and Rollback, so a type assertion on tx
// does not reach it): TxOf(tx).OnCommit(…). It returns nil for another
// transaction.
func TxOf(tx pgx.Tx) *Tx {
	t, _ := txguard.Unwrap(tx).(*Tx)
	return t
}

// OnCommit runs f after tx commits, never when it rolls back: a handler (or
// its fake dependencies) records its effects with it, so that a test sees
// only committed ones.
func (tx *Tx) OnCommit(f func()) {
	tx.mu.Lock()
	tx.onCommit = append(tx.onCommit, f)
	tx.mu.Unlock()
}

// Committed reports whether tx was committed.
func (tx *Tx) Committed() bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	return tx.ended && tx.commit
}

// RolledBack reports whether tx was rolled back.
func (tx *Tx) RolledBack() bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	return tx.ended && !tx.commit
}

// end marks tx ended, reporting false when it already was.
func (tx *Tx) end(commit bool) bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return false
	}
	tx.ended, tx.commit = true, commit
	return true
}

// Commit implements pgx.Tx.
func (tx *Tx) Commit(ctx context.Context) error {
	if !tx.end(true) {
		return pgx.ErrTxClosed
	}
	if err := tx.mem.Commit(ctx); err != nil {
		return err
	}
	tx.mu.Lock()
	fs := tx.onCommit
	tx.mu.Unlock()
	for _, f := range fs {
		f()
	}
	return nil
}

// Rollback implements pgx.Tx.
func (tx *Tx) Rollback(ctx context.Context) error {
	if !tx.end(false) {
		return pgx.ErrTxClosed
	}
	return tx.mem.Rollback(ctx)
}

// Begin implements pgx.Tx: ErrNoSQL (a savepoint is SQL).
func (tx *Tx) Begin(context.Context) (pgx.Tx, error) { return nil, ErrNoSQL }

// CopyFrom implements pgx.Tx: ErrNoSQL.
func (tx *Tx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, ErrNoSQL
}

// SendBatch implements pgx.Tx: every result is ErrNoSQL.
func (tx *Tx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return noSQLBatch{} }

// LargeObjects implements pgx.Tx: the zero value, which panics when used.
func (tx *Tx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare implements pgx.Tx: ErrNoSQL.
func (tx *Tx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, ErrNoSQL
}

// Exec implements pgx.Tx: ErrNoSQL.
func (tx *Tx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, ErrNoSQL
}

// Query implements pgx.Tx: ErrNoSQL.
func (tx *Tx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, ErrNoSQL }

// QueryRow implements pgx.Tx: a row whose Scan returns ErrNoSQL.
func (tx *Tx) QueryRow(context.Context, string, ...any) pgx.Row { return noSQLRow{} }

// Conn implements pgx.Tx: nil, there is no connection.
func (tx *Tx) Conn() *pgx.Conn { return nil }

type noSQLRow struct{}

func (noSQLRow) Scan(...any) error { return ErrNoSQL }

type noSQLBatch struct{}

func (noSQLBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, ErrNoSQL }
func (noSQLBatch) Query() (pgx.Rows, error)         { return nil, ErrNoSQL }
func (noSQLBatch) QueryRow() pgx.Row                { return noSQLRow{} }
func (noSQLBatch) Close() error                     { return ErrNoSQL }
func (noSQLBatch) Tx() pgx.Tx                       { return nil }

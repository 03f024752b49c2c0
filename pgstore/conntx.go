package pgstore

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connTx is the pgx.Tx that Do hands to its function: a transaction run by
// hand on a pooled connection, since its BEGIN went out in the same round
// trip as the claim (beginClaim), which pgx's own transaction type cannot
// do. Otherwise it behaves as pgx's: Commit and Rollback end it and return
// the connection to the pool, Begin makes a savepoint. LargeObjects is not
// supported on it.
type connTx struct {
	pc     *pgxpool.Conn
	conn   *pgx.Conn
	closed bool
	sp     int
}

var _ pgx.Tx = (*connTx)(nil)

// end returns the connection; a broken one is closed so the pool drops it.
func (t *connTx) end(ctx context.Context, broken bool) {
	t.closed = true
	if broken {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = t.conn.Close(cctx)
		cancel()
	}
	t.pc.Release()
}

func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.sp++
	name := "sp_" + strconv.Itoa(t.sp)
	if _, err := t.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{parent: t, name: name}, nil
}

func (t *connTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	tag, err := t.conn.Exec(ctx, "commit")
	t.end(ctx, err != nil)
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *connTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	_, err := t.conn.Exec(ctx, "rollback")
	t.end(ctx, err != nil)
	return err
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return &closedBatch{}
	}
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects is not supported: its zero value panics when used.
func (t *connTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return errRow{pgx.ErrTxClosed}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a nested transaction of a connTx.
type savepointTx struct {
	parent *connTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) open() bool { return !s.closed && !s.parent.closed }

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if !s.open() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Begin(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if !s.open() {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.conn.Exec(ctx, "release savepoint "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if !s.open() {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.parent.conn.Exec(ctx, "rollback to savepoint "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if !s.open() {
		return 0, pgx.ErrTxClosed
	}
	return s.parent.CopyFrom(ctx, table, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !s.open() {
		return &closedBatch{}
	}
	return s.parent.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if !s.open() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.open() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.parent.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !s.open() {
		return nil, pgx.ErrTxClosed
	}
	return s.parent.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !s.open() {
		return errRow{pgx.ErrTxClosed}
	}
	return s.parent.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.parent.conn }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return nil, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return errRow{pgx.ErrTxClosed} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }

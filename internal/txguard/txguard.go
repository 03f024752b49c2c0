// Package txguard guards the transaction that the library hands a handler:
// the library opened it, holds the key in it, and ends it; the handler
// only writes in it. Commit and Rollback are refused, so is SQL that ends
// the transaction (on it and on the savepoints it opens), and Check tells,
// after the handler returned, whether it ended or broke the transaction
// some other way (SQL sent on the connection itself, a failed statement
// whose error it swallowed).
package txguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrHandlerEndedTx marks the error of a handler that ended or broke the
// transaction it was handed.
var ErrHandlerEndedTx = errors.New("the handler's transaction belongs to the library")

// Tx is a handler's view of the library's transaction: every method of
// pgx.Tx but Commit and Rollback, which return an error naming the rule,
// and SQL that ends the transaction, refused the same way. Begin opens a
// savepoint (pgx's nested transaction), whose Commit and Rollback are the
// handler's to call, and whose SQL is checked as Tx's is.
type Tx struct {
	pgx.Tx
	who string // "the handler of message 0190…", "the HTTP handler"

	mu    sync.Mutex
	tried string // "Commit" or "Rollback", the first the handler called
	ended bool   // the library is done with the transaction
}

// Wrap returns tx as handed to a handler; who names the handler in errors.
func Wrap(tx pgx.Tx, who string) *Tx { return &Tx{Tx: tx, who: who} }

// Unwrap returns the transaction tx wraps, or tx itself.
func Unwrap(tx pgx.Tx) pgx.Tx {
	if g, ok := tx.(*Tx); ok {
		return g.Tx
	}
	return tx
}

// End marks the transaction as done with: from then on Commit and Rollback
// return pgx.ErrTxClosed, as on a transaction that ended.
func (t *Tx) End() {
	t.mu.Lock()
	t.ended = true
	t.mu.Unlock()
}

// Commit refuses: the library commits the transaction, with the key, once
// the handler returned.
func (t *Tx) Commit(context.Context) error { return t.refuse("Commit") }

// Rollback refuses: the library rolls the transaction back, key included,
// when the handler returns an error.
func (t *Tx) Rollback(context.Context) error { return t.refuse("Rollback") }

// Begin opens a savepoint, guarded as t is.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{Tx: sp, root: t}, nil
}

// Exec refuses SQL that ends the transaction (COMMIT, END, ROLLBACK
// without TO, ABORT, PREPARE TRANSACTION), and runs anything else.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return checkedExec(ctx, t, t.Tx, sql, args)
}

// Query refuses SQL that ends the transaction, as Exec does.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return checkedQuery(ctx, t, t.Tx, sql, args)
}

// QueryRow refuses SQL that ends the transaction, as Exec does: the row's
// Scan returns the error.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return checkedQueryRow(ctx, t, t.Tx, sql, args)
}

// SendBatch refuses a batch with SQL that ends the transaction: its
// results all return the error.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return checkedBatch(ctx, t, t.Tx, b)
}

// Prepare refuses a statement that ends the transaction (run later by its
// name, it would slip past Exec's check).
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return checkedPrepare(ctx, t, t.Tx, name, sql)
}

// savepoint is a handler's savepoint: its own Commit and Rollback release
// and roll back to it, and its SQL is checked as the root's.
type savepoint struct {
	pgx.Tx
	root *Tx
}

func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepoint{Tx: sp, root: s.root}, nil
}

func (s *savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return checkedExec(ctx, s.root, s.Tx, sql, args)
}

func (s *savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return checkedQuery(ctx, s.root, s.Tx, sql, args)
}

func (s *savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return checkedQueryRow(ctx, s.root, s.Tx, sql, args)
}

func (s *savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return checkedBatch(ctx, s.root, s.Tx, b)
}

func (s *savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return checkedPrepare(ctx, s.root, s.Tx, name, sql)
}

func checkedExec(ctx context.Context, root *Tx, tx pgx.Tx, sql string, args []any) (pgconn.CommandTag, error) {
	if op := endsTx(sql); op != "" {
		return pgconn.CommandTag{}, root.refuse(op)
	}
	return tx.Exec(ctx, sql, args...)
}

func checkedQuery(ctx context.Context, root *Tx, tx pgx.Tx, sql string, args []any) (pgx.Rows, error) {
	if op := endsTx(sql); op != "" {
		return nil, root.refuse(op)
	}
	return tx.Query(ctx, sql, args...)
}

func checkedQueryRow(ctx context.Context, root *Tx, tx pgx.Tx, sql string, args []any) pgx.Row {
	if op := endsTx(sql); op != "" {
		return errRow{root.refuse(op)}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func checkedBatch(ctx context.Context, root *Tx, tx pgx.Tx, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if op := endsTx(q.SQL); op != "" {
			return errBatch{root.refuse(op)}
		}
	}
	return tx.SendBatch(ctx, b)
}

func checkedPrepare(ctx context.Context, root *Tx, tx pgx.Tx, name, sql string) (*pgconn.StatementDescription, error) {
	if op := endsTx(sql); op != "" {
		return nil, root.refuse(op)
	}
	return tx.Prepare(ctx, name, sql)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// endsTx returns the command of the first statement of sql that ends the
// transaction it runs in ("COMMIT (as SQL)", …), or "". Statements are
// split at semicolons outside quotes and comments, and judged by their
// first words.
func endsTx(sql string) string {
	for _, stmt := range statements(sql) {
		f := strings.Fields(strings.ToUpper(stmt))
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "COMMIT", "END", "ABORT":
			if len(f) > 1 && f[0] == "COMMIT" && f[1] == "PREPARED" {
				continue // not in a transaction block: Postgres refuses it
			}
			return f[0] + " (as SQL)"
		case "ROLLBACK":
			rest := f[1:]
			if len(rest) > 0 && (rest[0] == "WORK" || rest[0] == "TRANSACTION") {
				rest = rest[1:]
			}
			if len(rest) > 0 && (rest[0] == "TO" || rest[0] == "PREPARED") {
				continue
			}
			return "ROLLBACK (as SQL)"
		case "PREPARE":
			if len(f) > 1 && f[1] == "TRANSACTION" {
				return "PREPARE TRANSACTION"
			}
		}
	}
	return ""
}

// statements splits sql at the semicolons outside string literals ('…',
// E'…' with backslash escapes, "…" identifiers, $tag$…$tag$ bodies) and
// comments (-- …, nested /* … */), with the comments left out.
func statements(sql string) []string {
	if !strings.ContainsAny(sql, ";-/") {
		return []string{sql}
	}
	var out []string
	var cur strings.Builder
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '\'':
			j := quoted(sql, i, i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !identChar(sql[i-2])))
			cur.WriteString(sql[i:j])
			i = j
		case c == '"':
			j := quoted(sql, i, false)
			cur.WriteString(sql[i:j])
			i = j
		case c == '$' && (i == 0 || !identChar(sql[i-1])) && dollarTag(sql[i:]) != "":
			tag := dollarTag(sql[i:])
			j := strings.Index(sql[i+len(tag):], tag)
			if j < 0 {
				cur.WriteString(sql[i:])
				i = len(sql)
				continue
			}
			end := i + len(tag) + j + len(tag)
			cur.WriteString(sql[i:end])
			i = end
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				i = len(sql)
				continue
			}
			cur.WriteByte(' ')
			i += j
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			cur.WriteByte(' ')
			i = comment(sql, i)
		case c == ';':
			out = append(out, cur.String())
			cur.Reset()
			i++
		default:
			cur.WriteByte(c)
			i++
		}
	}
	return append(out, cur.String())
}

// quoted returns the index after the literal that starts with the quote at
// sql[i]; a doubled quote stands for one, and with backslash escapes a
// backslash takes the next byte as is.
func quoted(sql string, i int, backslash bool) int {
	q := sql[i]
	for j := i + 1; j < len(sql); j++ {
		switch {
		case backslash && sql[j] == '\\':
			j++
		case sql[j] == q && j+1 < len(sql) && sql[j+1] == q:
			j++
		case sql[j] == q:
			return j + 1
		}
	}
	return len(sql)
}

// comment returns the index after the block comment that starts at
// sql[i], nested comments included.
func comment(sql string, i int) int {
	depth := 0
	for j := i; j+1 < len(sql); j++ {
		switch {
		case sql[j] == '/' && sql[j+1] == '*':
			depth++
			j++
		case sql[j] == '*' && sql[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(sql)
}

func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// dollarTag returns the dollar-quote tag that s starts with ("$$",
// "$body$"), or "" ($1, a lone $).
func dollarTag(s string) string {
	for j := 1; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '$':
			return s[:j+1]
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || (j > 1 && c >= '0' && c <= '9'):
		default:
			return ""
		}
	}
	return ""
}

func (t *Tx) refuse(op string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return pgx.ErrTxClosed
	}
	if t.tried == "" {
		t.tried = op
	}
	return t.opError(op)
}

// status is the transaction's status as the server last reported it ('T',
// 'E', 'I'), or 'T' for a transaction with no connection (a test double's).
func (t *Tx) status() byte {
	c := t.Tx.Conn()
	if c == nil || c.PgConn() == nil {
		return 'T'
	}
	return c.PgConn().TxStatus()
}

// Aborted reports whether a failed statement aborted the transaction, and
// the handler did not end it.
func (t *Tx) Aborted() bool { return !t.Tried() && t.status() == 'E' }

// Ended reports whether the transaction is no longer open on the server:
// the handler ended it with SQL the guard could not see (on the
// connection itself).
func (t *Tx) Ended() bool { return t.status() == 'I' }

// Tried reports whether the handler called Commit or Rollback, or sent
// SQL that ends the transaction.
func (t *Tx) Tried() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tried != ""
}

func (t *Tx) opError(op string) error {
	return fmt.Errorf("%w: %s called %s on it: the library commits it with the key when the handler returns nil, "+
		"and rolls it back, key included, when the handler returns an error; return an error instead of rolling back, "+
		"and use tx.Begin (a savepoint) around a statement that may fail", ErrHandlerEndedTx, t.who, op)
}

// Check reports whether the handler, which returned handlerErr, broke the
// transaction: it called Commit or Rollback (even when it then dropped
// their error or returned another), or it returned nil on a transaction it
// ended with SQL of its own or that a failed statement aborted. A broken
// transaction is the handler's fault, and no retry mends it.
func (t *Tx) Check(handlerErr error) error {
	t.mu.Lock()
	tried := t.tried
	t.mu.Unlock()
	if tried != "" {
		return t.opError(tried)
	}
	if handlerErr != nil {
		return nil
	}
	switch t.status() {
	case 'E':
		return fmt.Errorf("%w: %s returned success, but a statement in its transaction failed, which aborted the "+
			"transaction: return that statement's error, or run a statement that may fail in a savepoint (tx.Begin) "+
			"and roll back to it", ErrHandlerEndedTx, t.who)
	case 'I':
		return fmt.Errorf("%w: %s ended its transaction with SQL of its own, on the connection itself "+
			"(tx.Conn()): what it wrote before is committed with the key, and nothing after; "+
			"the library commits the transaction when the handler returns nil", ErrHandlerEndedTx, t.who)
	}
	return nil
}

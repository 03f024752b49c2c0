package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
)

// The statements httpkey's transactional mode sends in the round trips of
// BEGIN and COMMIT: a request there costs the round trips of a plain
// handler's transaction (BEGIN with the lock and the claim, the handler's
// statements, the response with COMMIT). A statement sent ahead of the
// next in one pipeline cannot stop it by its answer, only by failing (the
// server skips what follows a failed statement up to the batch's end, and
// the transaction is aborted): so the lock and the response's UPDATE fail
// when they did not do what the next one relies on, with the messages
// below.
const (
	// keyLockedMsg is the error of lockOrFailSQL when another transaction
	// holds the key's lock.
	keyLockedMsg = "exactly: key lock held by another transaction"
	// lockOrFailSQL takes a key's lock (TryLockKeyTx's) without waiting, or
	// fails with keyLockedMsg (an invalid boolean, at run time: the lock
	// function is volatile, so the planner cannot fold the CASE).
	lockOrFailSQL = "SELECT (CASE WHEN pg_try_advisory_xact_lock($1) THEN 'true' ELSE '" + keyLockedMsg + "' END)::boolean"
	// notOneRowMsg is the error of a oneRowSQL statement that did not
	// update exactly one row.
	notOneRowMsg = "exactly: no row of the key claimed in this transaction to store the result with"
)

// errKeyLocked: beginLockClaim found the key's lock held by another
// transaction.
var errKeyLocked = errors.New("pgstore: the key's lock is held by another transaction")

// oneRowSQL wraps stmt, whose last line selects how many rows it updated
// ("\nSELECT count"), so that it fails with notOneRowMsg unless that is 1.
func oneRowSQL(stmt string) string {
	i := strings.LastIndex(stmt, "\nSELECT ")
	return stmt[:i] + "\nSELECT (CASE WHEN " + stmt[i+len("\nSELECT "):] + " = 1 THEN 'true' ELSE '" + notOneRowMsg + "' END)::boolean"
}

// failedWith reports whether err is the invalid boolean of one of the
// statements above that failed with msg.
func failedWith(err error, msg string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, msg)
}

func isKeyLocked(err error) bool { return failedWith(err, keyLockedMsg) }

// BeginLockClaimTx opens a transaction at Config.IsoLevel, takes req.Key's
// lock in it without waiting (the lock of TryLockKeyTx) and claims req.Key
// in it (ClaimTx), all in one round trip. When another transaction holds
// the lock, the claim does not run: the transaction is rolled back and
// locked is false (tx nil, err nil). Otherwise tx is returned whenever it
// was opened, also with the claim's error: the caller rolls it back, or
// ends it with CompleteCommitTx. httpkey's transactional mode begins its
// requests' transactions with it.
//
// The claim only inserts: a new key costs the insert alone, and a stored
// key (a client's retry) one more round trip, which reads its row.
//
// tx is a transaction of the store's own on a pooled connection, as Do's
// is: it behaves as pgx's (Commit and Rollback end it and return the
// connection, Begin makes a savepoint), but LargeObjects is not supported
// on it.
func (s *Store) BeginLockClaimTx(ctx context.Context, req dedupe.Request) (tx pgx.Tx, locked bool, c dedupe.Claim, err error) {
	t, c, err := s.beginLockClaim(ctx, req, true)
	if errors.Is(err, errKeyLocked) {
		return nil, false, dedupe.Claim{}, nil
	}
	if t == nil {
		return nil, false, c, err
	}
	return t, true, c, err
}

// CompleteCommitTx stores result with c's key (CompleteTx) and commits tx,
// in one round trip when tx came from BeginLockClaimTx (else in as many as
// CompleteTx and Commit take). The UPDATE that stores the result fails,
// and so the COMMIT does not run, when it did not find the key's row: the
// transaction is then left open for the caller to roll back, as after any
// error of the UPDATE. An error of the COMMIT itself is wrapped as
// "pgstore: commit <key>: ...", and the transaction is ended.
func (s *Store) CompleteCommitTx(ctx context.Context, tx pgx.Tx, c dedupe.Claim, result []byte) error {
	ct, ok := tx.(*connTx)
	if !ok || result == nil {
		if err := s.CompleteTx(ctx, tx, c, result); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return classify("commit "+c.Record.Key.String(), err)
		}
		return nil
	}
	if ct.closed {
		return pgx.ErrTxClosed
	}
	if err := s.checkResult(result); err != nil {
		return err
	}
	k := c.Record.Key
	if !c.Decision.Run() {
		return fmt.Errorf("pgstore: CompleteTx of %s: the claim's decision is %v, not one that runs the handler", k, c.Decision)
	}
	stmt, args, err := s.l.resultOne(ctx, ct, k, result)
	if err != nil {
		return classify("complete "+k.String(), err)
	}
	b := &pgx.Batch{}
	b.Queue(stmt, args...)
	b.Queue("commit")
	br := ct.conn.SendBatch(ctx, b)
	_, uerr := br.Exec()
	tag, cerr := br.Exec()
	if err := br.Close(); err != nil && cerr == nil && uerr == nil {
		cerr = err
	}
	switch {
	case uerr != nil && (failedWith(uerr, notOneRowMsg) || pgerr.IsSingleTableRetired(uerr)):
		return fmt.Errorf("pgstore: complete %s: key not claimed in this transaction", k)
	case uerr != nil && layoutChanged(uerr):
		return s.l.layoutError("complete "+k.String(), uerr)
	case uerr != nil:
		var pgErr *pgconn.PgError
		if !errors.As(uerr, &pgErr) {
			// No answer: the COMMIT went out with the UPDATE and may have
			// committed.
			ct.end(ctx, true)
			return classify("commit "+k.String(), uerr)
		}
		return classify("complete "+k.String(), uerr)
	case cerr != nil:
		ct.end(ctx, true)
		return classify("commit "+k.String(), cerr)
	}
	ct.end(ctx, false)
	if tag.String() == "ROLLBACK" {
		return classify("commit "+k.String(), pgx.ErrTxCommitRollback)
	}
	return nil
}

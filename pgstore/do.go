package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/txguard"
)

// TxFunc is the work that Do runs once per key, in the transaction that
// holds the claim. Its result is stored for duplicates.
type TxFunc = func(ctx context.Context, tx pgx.Tx) (result []byte, err error)

// Do runs fn at most once for req.Key, with effect exactly once: it begins
// a transaction, claims the key, runs fn in the same transaction, stores fn's
// result and commits. A duplicate does not run fn; its Claim carries the
// stored result. Either way the result is in the returned Claim's
// Record.Result.
//
// An error from fn rolls everything back, the key included, and is returned
// as is: the next delivery runs fn again. The transaction is Do's: its
// Commit and Rollback return an error, and fn calling them (or returning nil
// on a transaction that it ended with SQL, or that a failed statement
// aborted) fails with a permanent error (dedupe.IsPermanent) that names the
// rule. Transient failures (serialisation
// failures, deadlocks, a lost connection) retry the whole transaction up to
// Config.MaxTxAttempts times with jittered back-off.
//
// A COMMIT whose answer never arrived (the connection dropped) may or may
// not have committed; Do runs the transaction again to find out. When the
// key is then there with the completion time of the transaction whose
// commit went unanswered, that write was this call's own: the Claim reports the
// first decision (DecisionNew or DecisionTakeover), not a duplicate.
func (s *Store) Do(ctx context.Context, req dedupe.Request, fn TxFunc) (dedupe.Claim, error) {
	if err := req.Validate(); err != nil {
		return dedupe.Claim{}, err
	}
	wait := backoff.New(s.cfg.RetryBackoff, time.Second)
	var unanswered *dedupe.Claim // a claim whose COMMIT got no answer
	for attempt := 1; ; attempt++ {
		c, committing, err := s.doTx(ctx, req, fn)
		if err == nil && unanswered != nil && c.Decision == dedupe.DecisionDuplicate &&
			c.Record.CompletedAt.Equal(unanswered.Record.CompletedAt) && c.Record.Fingerprint == req.Fingerprint {
			c.Decision = unanswered.Decision // our own write, committed after all
			return c, nil
		}
		ambiguous := committing && !isServerError(err)
		if ambiguous {
			uc := c
			unanswered = &uc
		}
		if err == nil || (!ambiguous && !retryTx(err)) || attempt >= s.cfg.MaxTxAttempts {
			return c, err
		}
		s.cfg.Logger.DebugContext(ctx, "pgstore: retrying transaction", "key", req.Key.String(), "attempt", attempt, "err", err)
		if err := wait.SleepJittered(ctx); err != nil {
			return c, err
		}
	}
}

// isServerError reports whether err is Postgres's answer (then a COMMIT is
// known not to have committed).
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback)
}

// retryTx: transaction-level transient failures, marked by classify or
// returned by fn's own statements. In-flight keys are not retried here: a
// lease lasts far longer than Do should block.
func retryTx(err error) bool {
	var r *dedupe.RetryableError
	return errors.As(err, &r) || (!errors.Is(err, dedupe.ErrInFlight) && IsRetryableError(err))
}

// doTx is one attempt: BEGIN and the claim go in one round trip, then
// the function, the result and COMMIT. committing reports that err came
// from the COMMIT itself.
func (s *Store) doTx(ctx context.Context, req dedupe.Request, fn TxFunc) (_ dedupe.Claim, committing bool, err error) {
	tx, c, err := s.beginClaim(ctx, req)
	if tx != nil {
		defer pgtx.Rollback(ctx, tx)
	}
	if err != nil {
		return c, false, err
	}
	if c.Decision.Run() {
		guard := txguard.Wrap(tx, "the function given to Store.Do")
		defer guard.End()
		result, err := fn(ctx, guard)
		if broken := guard.Check(err); broken != nil {
			return c, false, dedupe.Permanent(fmt.Errorf("pgstore: %w", broken))
		}
		if err != nil {
			return c, false, err
		}
		if err := s.CompleteTx(ctx, tx, c, result); err != nil {
			return c, false, err
		}
		c.Record.Result = result
	}
	if err := tx.Commit(ctx); err != nil {
		return c, true, classify("commit "+req.Key.String(), err)
	}
	return c, false, nil
}

// LeaseFunc is the work that DoLease runs once per key, outside any
// transaction of ours (it calls a payment API, say).
type LeaseFunc = func(ctx context.Context) (result []byte, err error)

// DoLease runs fn at most once at a time for req.Key, under a lease, and
// completes the key when fn succeeds. While fn runs, the lease is extended
// every third of its length, so a slow fn keeps its key; if the lease
// cannot be extended (the database is out of reach, or another process
// took the key over), fn's context ends, with a cause wrapping
// dedupe.ErrLeaseLost, before the lease can run out. Only a process that
// died loses its key to another, once its lease ended. A failing fn
// releases the key (the next delivery takes it over at once) and its error
// is returned. A duplicate does not run fn and carries the stored result.
//
// Lease mode is at-least-once for fn's effects if the process dies between
// fn's success and the commit of Complete: give fn's external call the key as
// its own idempotency key.
func (s *Store) DoLease(ctx context.Context, req dedupe.Request, lease time.Duration, fn LeaseFunc) (dedupe.Claim, error) {
	start := time.Now()
	c, err := s.Acquire(ctx, req, lease)
	if err != nil || !c.Decision.Run() {
		return c, err
	}
	hctx, stop := s.holdLease(ctx, c, lease, start)
	result, err := fn(hctx)
	stop()
	// fn's effect happened (or failed) whatever became of ctx meanwhile: a
	// Timeout that fires after a payment went through must not keep the key
	// from completing, or the next delivery would pay again. Complete and
	// Release run on a context of their own, bounded by LeaseFinishTimeout,
	// and retry transient failures within it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), LeaseFinishTimeout)
	defer cancel()
	if err != nil {
		if rerr := s.finish(fctx, func() error { return s.Release(fctx, c) }); rerr != nil {
			return c, errors.Join(err, fmt.Errorf("pgstore: release after failure: %w", rerr))
		}
		return c, err
	}
	if err := s.finish(fctx, func() error { return s.Complete(fctx, c, result) }); err != nil {
		return c, err
	}
	c.Record.Result = result
	c.Record.Status = dedupe.StatusCompleted
	return c, nil
}

// holdLease extends c's lease, taken at start, while the returned context
// lives, and ends that context a margin before the lease would run out
// unextended. stop ends both.
func (s *Store) holdLease(ctx context.Context, c dedupe.Claim, lease time.Duration, start time.Time) (context.Context, func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The lease lasts at least lease from start (the database set its
		// end after start), measured on this process's monotonic clock.
		until := start.Add(lease)
		margin := lease / 10
		tick := time.NewTicker(max(lease/3, time.Millisecond))
		defer tick.Stop()
		expire := time.NewTimer(time.Until(until.Add(-margin)))
		defer expire.Stop()
		for {
			select {
			case <-done:
				return
			case <-hctx.Done():
				return
			case <-expire.C:
				cancel(fmt.Errorf("pgstore: the lease of %s could not be extended before it ended: %w", c.Record.Key, dedupe.ErrLeaseLost))
				return
			case <-tick.C:
				sent := time.Now()
				ectx, ecancel := context.WithDeadline(hctx, until.Add(-margin))
				err := s.Extend(ectx, c, lease)
				ecancel()
				switch {
				case err == nil:
					until = sent.Add(lease)
					expire.Reset(time.Until(until.Add(-margin)))
				case errors.Is(err, dedupe.ErrLeaseLost):
					cancel(err)
					return
				default:
					s.cfg.Logger.WarnContext(ctx, "pgstore: extending a lease", "key", c.Record.Key.String(), "err", err)
				}
			}
		}
	}()
	return hctx, func() {
		close(done)
		wg.Wait()
		cancel(nil)
	}
}

// LeaseFinishTimeout bounds how long DoLease tries to complete or release a
// key after fn returned, independently of the caller's context.
const LeaseFinishTimeout = 10 * time.Second

// finish runs op until it succeeds, fails for good, or ctx ends.
func (s *Store) finish(ctx context.Context, op func() error) error {
	wait := backoff.New(s.cfg.RetryBackoff, time.Second)
	for {
		err := op()
		if err == nil || !retryTx(err) {
			return err
		}
		if serr := wait.SleepJittered(ctx); serr != nil {
			return err
		}
	}
}

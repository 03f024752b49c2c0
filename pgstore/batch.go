package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/txguard"
)

// BatchFunc is the work that DoBatch runs once for a batch, in the
// transaction that holds the batch's claims. fresh lists the indexes (into
// DoBatch's reqs, ascending) of the requests whose handler must run: the
// new keys and the expired leases taken over. It returns nil, or one result
// per fresh request (results[i] for reqs[fresh[i]]; nil stores nothing),
// stored with the keys for their duplicates.
type BatchFunc = func(ctx context.Context, tx pgx.Tx, fresh []int) (results [][]byte, err error)

// BatchClaimsFromContext returns, in the ctx that DoBatch hands its
// BatchFunc, the batch's claims as decided before fn runs
// ([dedupe.BatchClaimsFromContext]).
func BatchClaimsFromContext(ctx context.Context) ([]BatchClaim, bool) {
	return dedupe.BatchClaimsFromContext(ctx)
}

// BatchClaim is DoBatch's answer for one request ([dedupe.BatchClaim]).
type BatchClaim = dedupe.BatchClaim

// DoBatch is Do for many keys in one transaction: it begins a transaction,
// claims every valid key of reqs in one statement (the keys that conflict
// with stored ones are then read in one more, waiting for any transaction
// that holds them), decides each with [dedupe.Decide], runs fn once with the
// transaction and the indexes of the fresh requests (none: fn does not run),
// stores fn's results in one statement and commits. The answer has one
// BatchClaim per request, in reqs' order.
//
// On the partitioned layout (with no legacy table to read), the claim
// first inserts every key as new with a statement that answers only how
// many it inserted, the usual batch's whole answer; when some key was
// stored already, that transaction is rolled back and the batch is
// claimed, in a new one, by the statement that answers each stored key
// (the ROLLBACK and the new BEGIN go with it, in one more round trip). The
// batches after one that found a stored key go to that statement at once,
// until one of them inserts all its keys.
//
// Duplicates carry their stored result; key reuses, invalid keys and keys
// in flight carry their error in BatchClaim.Err and are not handed to fn.
// A key that appears more than once in reqs is claimed by its first
// occurrence; the later ones are decided against it as if it had been
// stored before them: duplicates of it with its result when their
// fingerprint is the same, key reuses when it differs.
//
// Keys are claimed in (scope, id) order, so concurrent batches over
// overlapping keys wait for each other instead of deadlocking; a batch that
// waited on another's uncommitted key finds it completed (a duplicate) or,
// if that batch rolled back, claims it itself.
//
// An error from fn rolls everything back, every key included, and is
// returned as is with a nil answer: the next delivery runs fn again. A
// batch-wide failure (serialisation failure, deadlock, lost connection)
// retries the whole transaction as Do does, up to Config.MaxTxAttempts
// times. A COMMIT whose answer never arrived is settled as in Do: the keys
// found completed by the unanswered transaction itself keep their first
// decision.
func (s *Store) DoBatch(ctx context.Context, reqs []dedupe.Request, fn BatchFunc) ([]BatchClaim, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := s.l.prepareBatch(ctx, reqs); err != nil {
		return nil, err
	}
	wait := backoff.New(s.cfg.RetryBackoff, time.Second)
	var unanswered []BatchClaim // the answer of a transaction whose COMMIT got no answer
	for attempt := 1; ; attempt++ {
		out, committing, err := s.doBatchTx(ctx, reqs, fn)
		if err == nil && unanswered != nil {
			for i := range out {
				u := unanswered[i]
				if u.Err == nil && u.Decision.Run() && out[i].Err == nil && out[i].Decision == dedupe.DecisionDuplicate &&
					out[i].Record.CompletedAt.Equal(u.Record.CompletedAt) && out[i].Record.Fingerprint == reqs[i].Fingerprint {
					out[i].Decision = u.Decision // our own write, committed after all
				}
			}
		}
		ambiguous := committing && !isServerError(err)
		if ambiguous {
			unanswered = out
		}
		if err == nil || (!ambiguous && !retryTx(err)) || attempt >= s.cfg.MaxTxAttempts {
			if err != nil {
				return nil, err
			}
			return out, nil
		}
		s.cfg.Logger.DebugContext(ctx, "pgstore: retrying batch transaction", "keys", len(reqs), "attempt", attempt, "err", err)
		if err := wait.SleepJittered(ctx); err != nil {
			return nil, err
		}
	}
}

// doBatchTx is one attempt of DoBatch; committing reports that err came
// from the COMMIT itself (out is then the answer that was committing).
func (s *Store) doBatchTx(ctx context.Context, reqs []dedupe.Request, fn BatchFunc) (out []BatchClaim, committing bool, err error) {
	// BEGIN goes in one round trip with the claim statement.
	if err := s.l.beforeBatchTx(ctx); err != nil {
		return nil, false, err
	}
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, classify("begin", err)
	}
	tx := &connTx{pc: pc, conn: pc.Conn()}
	defer pgtx.Rollback(ctx, tx)
	out, err = s.claimBatchTx(ctx, tx, reqs, true)
	if err != nil {
		return nil, false, err
	}
	var fresh []int
	for i, c := range out {
		if c.Err == nil && c.Decision.Run() {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) > 0 {
		guard := txguard.Wrap(tx, "the function given to Store.DoBatch")
		defer guard.End()
		results, err := fn(dedupe.ContextWithBatchClaims(ctx, out), guard, fresh)
		if broken := guard.Check(err); broken != nil {
			return nil, false, dedupe.Permanent(fmt.Errorf("pgstore: %w", broken))
		}
		if err != nil {
			return nil, false, err
		}
		if results != nil && len(results) != len(fresh) {
			return nil, false, fmt.Errorf("pgstore: DoBatch: fn returned %d results for %d fresh requests: return nil or one per fresh request",
				len(results), len(fresh))
		}
		if err := s.CompleteBatchTx(ctx, tx, out, fresh, results); err != nil {
			return nil, false, err
		}
		// Later copies of a fresh key are duplicates of it: they get its result.
		ran := make(map[dedupe.Key]int, len(fresh))
		for _, i := range fresh {
			ran[reqs[i].Key] = i
		}
		for i := range out {
			if f, ok := ran[reqs[i].Key]; ok && f != i && out[i].Err == nil && out[i].Decision == dedupe.DecisionDuplicate {
				out[i].Record.Result = out[f].Record.Result
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, true, classify(fmt.Sprintf("commit a batch of %d keys", len(reqs)), err)
	}
	return out, false, nil
}

// ClaimBatchTx claims every key of reqs in the caller's transaction, as
// DoBatch does, and returns one BatchClaim per request: run the handler in
// tx for those whose Outcome.Run() and whose Err is nil, then
// CompleteBatchTx and commit. Keys are written COMPLETED at once, as by
// ClaimTx.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request) ([]BatchClaim, error) {
	if tx == nil {
		return nil, errors.New("pgstore: ClaimBatchTx: tx is nil")
	}
	return s.claimBatchTx(ctx, tx, reqs, false)
}

// claimBatchTx is ClaimBatchTx; with begin, tx is a connTx whose
// BEGIN is still to be sent, with the claim statement.
func (s *Store) claimBatchTx(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, begin bool) ([]BatchClaim, error) {
	out := make([]BatchClaim, len(reqs))
	// first maps a key to the index of its first valid request; order lists
	// those indexes sorted by key, the order in which keys are claimed.
	first := make(map[dedupe.Key]int, len(reqs))
	order := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		if _, seen := first[r.Key]; !seen {
			first[r.Key] = i
			order = append(order, i)
		}
	}
	slices.SortFunc(order, byKey(reqs))
	if len(order) > 0 {
		if err := s.claimBatch(ctx, tx, reqs, order, out, begin); err != nil {
			return nil, err
		}
	} else if begin {
		if _, err := tx.Exec(ctx, s.beginSQL); err != nil {
			return nil, classify("begin", err)
		}
	}
	// Later copies of a key are decided against its first request, as if
	// that one had been stored before them.
	for i, r := range reqs {
		f, ok := first[r.Key]
		if !ok || f == i || out[i].Err != nil {
			continue
		}
		rec, err := batchRecord(out[f], reqs[f])
		if err != nil {
			out[i].Err = err // in flight, like its first copy
			continue
		}
		decision, err := dedupe.Decide(rec, r.Fingerprint, rec.CompletedAt)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Claim = dedupe.Claim{Decision: decision, Record: rec, TTL: r.TTL}
	}
	return out, nil
}

// ErrClaimAlone is the Err of a later copy of a key in a batch whose first
// copy could not be claimed (it reused the key with another payload, say):
// what the later copy gets depends on the stored key alone (a duplicate
// with its stored result, a takeover of an expired lease, in flight, a key
// reuse), so claim it on its own, with Store.Do, after the batch. Nothing
// was written for it.
var ErrClaimAlone = errors.New("pgstore: an earlier copy of this key in the batch could not be claimed: claim this request on its own")

// batchRecord is the record that a later copy of a key is decided
// against: the one its first request is writing. When the first request
// could not be claimed, the later copy is not decided here: in flight like
// the first, or ErrClaimAlone.
func batchRecord(c BatchClaim, req dedupe.Request) (dedupe.Record, error) {
	var inflight *dedupe.InFlightError
	switch {
	case errors.As(c.Err, &inflight):
		return dedupe.Record{}, c.Err
	case c.Err != nil:
		return dedupe.Record{}, ErrClaimAlone
	}
	return c.Record, nil
}

// decide applies the decision table to a conflicting row; a takeover is
// only marked here (claimBatch carries it out).
func (s *Store) decide(c *BatchClaim, req dedupe.Request, rec dedupe.Record, now time.Time) {
	decision, err := dedupe.Decide(rec, req.Fingerprint, now)
	if err != nil {
		c.Err = err
		return
	}
	c.Claim = dedupe.Claim{Decision: decision, Record: rec, TTL: req.TTL}
}

// isPerRequest reports whether a claim's error belongs to its request
// rather than to the batch.
func isPerRequest(err error) bool {
	return errors.Is(err, dedupe.ErrKeyReused) || errors.Is(err, dedupe.ErrInFlight) || errors.Is(err, dedupe.ErrInvalidKey)
}

// CompleteBatchTx stores the results of the fresh claims of a batch
// (claims[fresh[i]] gets results[i]) in one statement; nil results, or a
// nil slice, cost nothing, since the keys were written COMPLETED when they
// were claimed. On return, each fresh claim's Record.Result is its result.
func (s *Store) CompleteBatchTx(ctx context.Context, tx pgx.Tx, claims []BatchClaim, fresh []int, results [][]byte) error {
	if results == nil {
		return nil
	}
	if len(results) != len(fresh) {
		return fmt.Errorf("pgstore: CompleteBatchTx: %d results for %d fresh claims", len(results), len(fresh))
	}
	var scopes, ids []string
	var blobs [][]byte
	for j, i := range fresh {
		c := &claims[i]
		if c.Err != nil || !c.Decision.Run() {
			return fmt.Errorf("pgstore: CompleteBatchTx of %s: the claim's decision is %v, not one that runs the handler", c.Record.Key, c.Decision)
		}
		if results[j] == nil {
			continue
		}
		if err := s.checkResult(results[j]); err != nil {
			return fmt.Errorf("pgstore: result of %s: %w", c.Record.Key, err)
		}
		scopes, ids, blobs = append(scopes, c.Record.Key.Scope), append(ids, c.Record.Key.ID), append(blobs, results[j])
	}
	if len(ids) > 0 {
		n, err := s.l.storeResults(ctx, tx, scopes, ids, blobs)
		if err != nil {
			return err
		}
		if n != int64(len(ids)) {
			return fmt.Errorf("pgstore: complete a batch: %d of %d keys were not claimed in this transaction", int64(len(ids))-n, len(ids))
		}
	}
	for j, i := range fresh {
		claims[i].Record.Result = results[j]
	}
	return nil
}

package consumertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// DoBatch implements consumer.BatchStore as [pgstore.Store.DoBatch] does:
// it begins a transaction, claims every key of reqs (in key order, so
// concurrent batches over the same keys wait for each other instead of
// deadlocking), runs fn once with the indexes of the fresh requests (none:
// fn does not run) and the claims in its ctx
// ([dedupe.BatchClaimsFromContext]), stores fn's results and commits. Each
// request's own failure (an invalid key, a key reused with another
// payload, a key in flight) is in its BatchClaim.Err; a key that appears
// more than once is claimed by its first occurrence, and the later ones are
// its duplicates (or key reuses). An error from fn rolls everything back
// and is returned with a nil answer; one marked [dedupe.Retryable] runs the
// transaction again, up to MemStoreConfig.MaxTxAttempts times.
func (s *MemStore) DoBatch(ctx context.Context, reqs []dedupe.Request,
	fn func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error)) ([]dedupe.BatchClaim, error) {
	return retrying(ctx, s.maxAttempts, func() ([]dedupe.BatchClaim, error) { return s.doBatchTx(ctx, reqs, fn) })
}

func (s *MemStore) doBatchTx(ctx context.Context, reqs []dedupe.Request,
	fn func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error)) ([]dedupe.BatchClaim, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	out := make([]dedupe.BatchClaim, len(reqs))
	first := make(map[dedupe.Key]int, len(reqs)) // a key's first occurrence
	order := make([]int, 0, len(reqs))
	for i, req := range reqs {
		if err := req.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		if _, ok := first[req.Key]; !ok {
			first[req.Key] = i
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(reqs[a].Key.Scope, reqs[b].Key.Scope), cmp.Compare(reqs[a].Key.ID, reqs[b].Key.ID))
	})
	for _, i := range order {
		c, err := s.keys.ClaimTx(ctx, tx.mem, reqs[i])
		switch {
		case err == nil:
			out[i].Claim = c
		case errors.Is(err, dedupe.ErrKeyReused), errors.Is(err, dedupe.ErrInFlight), errors.Is(err, dedupe.ErrInvalidKey):
			out[i].Err = err
		default:
			return nil, err
		}
	}
	var fresh []int
	for i, req := range reqs {
		f, ok := first[req.Key]
		if ok && f != i {
			out[i] = again(out[f], req)
		} else if out[i].Err == nil && out[i].Decision.Run() {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) > 0 {
		results, err := fn(dedupe.ContextWithBatchClaims(ctx, out), tx, fresh)
		if err != nil {
			return nil, err
		}
		if results != nil && len(results) != len(fresh) {
			return nil, fmt.Errorf("consumertest: DoBatch: fn returned %d results for %d fresh requests: "+
				"return nil or one per fresh request", len(results), len(fresh))
		}
		for j, i := range fresh {
			var result []byte
			if results != nil {
				result = results[j]
			}
			if err := s.keys.CompleteTx(ctx, tx.mem, out[i].Claim, result); err != nil {
				return nil, err
			}
			out[i].Record.Result, out[i].Record.Status = result, dedupe.StatusCompleted
		}
		for i, req := range reqs {
			if f, ok := first[req.Key]; ok && f != i && out[i].Err == nil {
				out[i].Record.Result = out[f].Record.Result
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// again decides a later occurrence of a key in a batch against its first
// occurrence's claim, as if that had been stored before it.
func again(first dedupe.BatchClaim, req dedupe.Request) dedupe.BatchClaim {
	rec := first.Record
	var reused *dedupe.KeyReusedError
	switch {
	case errors.As(first.Err, &reused):
		rec = dedupe.Record{Key: req.Key, Fingerprint: reused.Stored, Status: dedupe.StatusCompleted}
	case first.Err != nil:
		return dedupe.BatchClaim{Err: first.Err}
	default:
		rec.Status = dedupe.StatusCompleted
	}
	decision, err := dedupe.Decide(rec, req.Fingerprint, time.Time{})
	if err != nil {
		return dedupe.BatchClaim{Err: err}
	}
	return dedupe.BatchClaim{Claim: dedupe.Claim{Decision: decision, Record: rec, TTL: req.TTL}}
}

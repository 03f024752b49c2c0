// Package measure holds switches for measurements only. Each turns off part
// of what the library guarantees, to measure what that part costs or to
// show what goes wrong without it (a replay that applies commands twice):
// never use them in a deployment.
package measure

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/worker"
)

// NoDedupe is a worker plugin that runs each message (or batch) in a
// transaction of its own with no key: a redelivery applies it again. The
// worker's middleware, batching, outbox and hooks are unchanged; only the
// claim is gone, so a run with it and a run without measure the claim's
// cost.
func NoDedupe() worker.Plugin { return noDedupe{} }

type noDedupe struct{}

func (noDedupe) Store(s consumer.BatchStore) consumer.BatchStore { return NoDedupeStore(s) }

var _ worker.StorePlugin = noDedupe{}

// NoDedupeStore returns a store that claims no key: Do, DoLease and
// DoBatch run their function every time, in a transaction of s's (Begin)
// for Do and DoBatch, and report every request as new. For
// consumer.NewMiddleware and consumer.NewBatchConsumer in benchmarks.
func NoDedupeStore(s consumer.BatchStore) consumer.BatchStore { return plain{s} }

type plain struct{ consumer.BatchStore }

// Pool is the pool of the store it wraps, when it has one: the middleware
// reads a cut attempt's session on it.
func (p plain) Pool() *pgxpool.Pool {
	if pp, ok := p.BatchStore.(interface{ Pool() *pgxpool.Pool }); ok {
		return pp.Pool()
	}
	return nil
}

func (p plain) Do(ctx context.Context, req dedupe.Request, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (dedupe.Claim, error) {
	var result []byte
	err := p.inTx(ctx, func(tx pgx.Tx) (err error) {
		result, err = fn(ctx, tx)
		return err
	})
	if err != nil {
		return dedupe.Claim{}, err
	}
	return fresh(req, result), nil
}

func (p plain) DoLease(ctx context.Context, req dedupe.Request, _ time.Duration, fn func(ctx context.Context) ([]byte, error)) (dedupe.Claim, error) {
	result, err := fn(ctx)
	if err != nil {
		return dedupe.Claim{}, err
	}
	return fresh(req, result), nil
}

func (p plain) DoBatch(ctx context.Context, reqs []dedupe.Request,
	fn func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error)) ([]dedupe.BatchClaim, error) {
	out := make([]dedupe.BatchClaim, len(reqs))
	all := make([]int, len(reqs))
	for i, req := range reqs {
		out[i].Claim, all[i] = fresh(req, nil), i
	}
	var results [][]byte
	err := p.inTx(ctx, func(tx pgx.Tx) (err error) {
		results, err = fn(dedupe.ContextWithBatchClaims(ctx, out), tx, all)
		return err
	})
	if err != nil {
		return nil, err
	}
	if results != nil && len(results) != len(reqs) {
		return nil, fmt.Errorf("measure: %w: the batch function returned %d results for %d requests",
			dedupe.ErrMisconfigured, len(results), len(reqs))
	}
	for i := range results {
		out[i].Record.Result = results[i]
	}
	return out, nil
}

func (p plain) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := p.Begin(ctx)
	if err != nil {
		return err
	}
	defer pgtx.Rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func fresh(req dedupe.Request, result []byte) dedupe.Claim {
	return dedupe.Claim{Decision: dedupe.DecisionNew, TTL: req.TTL, Record: dedupe.Record{
		Key: req.Key, Fingerprint: req.Fingerprint, Status: dedupe.StatusCompleted, Result: result, Attempts: 1, Source: req.Source}}
}

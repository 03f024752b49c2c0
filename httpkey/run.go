package httpkey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
)

// runTx is transactional mode answering 409 for a key in flight: the
// transaction first takes the key's advisory lock without waiting (a
// duplicate of a request still running finds it taken), then claims the
// key, runs the handler, stores its response and commits.
func (m *Middleware) runTx(q *request, h http.Handler) (*recorder, dedupe.Claim, error) {
	ctx := q.r.Context()
	if err := m.check(ctx); err != nil {
		return nil, dedupe.Claim{}, err
	}
	rec, c, err := m.runTxOnce(ctx, q, h)
	var aa *abortedAnswer
	if errors.As(err, &aa) {
		return m.storeAlone(ctx, q, aa)
	}
	return rec, c, err
}

// check runs the store's Check once, on the pool, before a request takes
// its connection.
func (m *Middleware) check(ctx context.Context) error {
	if m.ready.Load() {
		return nil
	}
	if err := m.store.Check(ctx); err != nil {
		return err
	}
	m.ready.Store(true)
	return nil
}

func (m *Middleware) runTxOnce(ctx context.Context, q *request, h http.Handler) (*recorder, dedupe.Claim, error) {
	if p, ok := m.store.(pipelined); ok {
		return m.runTxPipelined(ctx, p, q, h)
	}
	tx, err := m.store.Begin(ctx)
	if err != nil {
		return nil, dedupe.Claim{}, err
	}
	defer pgtx.Rollback(ctx, tx)
	locked, err := m.store.TryLockKeyTx(ctx, tx, q.req.Key)
	if err != nil {
		return nil, dedupe.Claim{}, err
	}
	if !locked {
		c, err := m.lockedOut(ctx, tx, q)
		return nil, c, err
	}
	c, err := m.store.ClaimTx(ctx, tx, q.req)
	if err != nil || !c.Decision.Run() {
		return nil, c, err
	}
	rec, result, err := m.handle(ctx, q, h, &state{tx: tx})
	if err != nil {
		return rec, c, err
	}
	if err := m.store.CompleteTx(ctx, tx, c, result); err != nil {
		return rec, c, err
	}
	if err := tx.Commit(ctx); err != nil {
		return rec, c, fmt.Errorf("httpkey: commit %s: %w", q.req.Key, err)
	}
	return rec, c, nil
}

// runTxPipelined is runTxOnce's steps on a store that sends them in the
// round trips a plain handler's transaction takes: BEGIN, the lock and the
// claim in one, the handler's statements, the response's UPDATE and
// COMMIT in one.
func (m *Middleware) runTxPipelined(ctx context.Context, p pipelined, q *request, h http.Handler) (*recorder, dedupe.Claim, error) {
	tx, locked, c, err := p.BeginLockClaimTx(ctx, q.req)
	if tx != nil {
		defer pgtx.Rollback(ctx, tx)
	}
	if err != nil {
		return nil, c, err
	}
	if !locked {
		c, err := m.lockedOut(ctx, p.Pool(), q)
		return nil, c, err
	}
	if !c.Decision.Run() {
		return nil, c, nil
	}
	rec, result, err := m.handle(ctx, q, h, &state{tx: tx})
	if err != nil {
		return rec, c, err
	}
	if err := p.CompleteCommitTx(ctx, tx, c, result); err != nil {
		return rec, c, fmt.Errorf("httpkey: complete and commit %s: %w", q.req.Key, err)
	}
	return rec, c, nil
}

// storeAlone stores a's response with the key in a transaction of its own,
// after the handler's transaction rolled back: the handler's writes are
// gone, its answer stays. A request with the same key that ran in between
// has its own answer stored: that one is replayed.
func (m *Middleware) storeAlone(ctx context.Context, q *request, a *abortedAnswer) (*recorder, dedupe.Claim, error) {
	c, err := m.store.Do(ctx, q.req, func(context.Context, pgx.Tx) ([]byte, error) { return a.result, nil })
	return a.rec, c, err
}

// lockedOut answers a request that found its key's lock taken: by the
// first request, still running (409), or by another duplicate of a key
// that is already completed, which is then replayed or a reuse.
func (m *Middleware) lockedOut(ctx context.Context, db DBTX, q *request) (dedupe.Claim, error) {
	rec, err := m.store.GetTx(ctx, db, q.req.Key)
	if errors.Is(err, dedupe.ErrNotFound) {
		return dedupe.Claim{}, errBusy
	}
	if err != nil {
		return dedupe.Claim{}, err
	}
	d, err := dedupe.Decide(rec, q.req.Fingerprint, time.Now())
	if err != nil {
		return dedupe.Claim{}, err
	}
	if d != dedupe.DecisionDuplicate {
		return dedupe.Claim{}, errBusy
	}
	return dedupe.Claim{Decision: d, Record: rec}, nil
}

// runWait is transactional mode waiting for a key in flight: Store.Do,
// whose claim waits for the transaction that holds the key to end.
func (m *Middleware) runWait(q *request, h http.Handler) (*recorder, dedupe.Claim, error) {
	var rec *recorder
	ctx := q.r.Context()
	c, err := m.store.Do(ctx, q.req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		r, result, err := m.handle(ctx, q, h, &state{tx: tx})
		rec = r
		return result, err
	})
	var aa *abortedAnswer
	if errors.As(err, &aa) {
		return m.storeAlone(ctx, q, aa)
	}
	return rec, c, err
}

// runLease is lease mode: Store.DoLease, the handler outside any
// transaction, its context ended if the lease cannot be kept (DoLease
// extends it while the handler runs). A response too large to store is
// no reason to release the key: the handler's effect may have happened,
// so the key is completed with an answer that says so.
func (m *Middleware) runLease(q *request, h http.Handler) (*recorder, dedupe.Claim, error) {
	var rec *recorder
	c, err := m.store.DoLease(q.r.Context(), q.req, m.cfg.Lease, func(ctx context.Context) ([]byte, error) {
		r, result, err := m.handle(ctx, q, h, &state{})
		if errors.Is(err, errResponseLarge) {
			r = tooLarge(r, m.cfg.MaxResponseBytes)
			result, err = r.encode(m.cfg.ReplayHeaders)
		}
		rec = r
		return result, err
	})
	return rec, c, err
}

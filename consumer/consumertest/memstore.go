package consumertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/httpkey"
)

// MemStoreConfig configures a MemStore. The zero value (or a nil
// *MemStoreConfig) is usable.
type MemStoreConfig struct {
	// TTL is how long a completed key is kept. Defaults to dedupe.DefaultTTL.
	TTL time.Duration
	// MaxResultBytes bounds a stored result. Defaults to 1 MiB, as
	// pgstore's default.
	MaxResultBytes int
	// MaxTxAttempts bounds how often Do runs a transaction whose function
	// failed with an error marked [dedupe.Retryable], as
	// [pgstore.Config.MaxTxAttempts] does (without pausing between
	// attempts). Defaults to 5.
	MaxTxAttempts int
	// Now is the store's clock, for lease expiry and TTLs. Defaults to
	// time.Now.
	Now func() time.Time
}

// MemStore is a [consumer.BatchStore] in memory, for unit tests of
// handlers, per-message and batch, that write no SQL (they compute
// outputs, or write through Config.Outputs or a fake of their own). It keeps keys as pgstore does, with the same decision
// table ([dedupe.Decide]): a new key runs the handler and is committed with
// its result; a completed key with the same fingerprint is a duplicate and
// hands back the stored result; another fingerprint is a
// [*dedupe.KeyReusedError]; a failing handler rolls its key back. A key
// claimed by an open transaction makes other claims of it wait until that
// transaction ends. It also implements [dedupe.Store] with [pgx.Tx]
// transactions (its own [*Tx]), and passes the dedupetest conformance suite.
//
// It implements [httpkey.Store] too, for unit tests of HTTP handlers behind
// the httpkey middleware: [MemStore.TryLockKeyTx] keeps a second request
// with a key out while the first one's transaction is open, as pgstore's
// advisory lock does.
//
// Its transactions run no SQL: see [Tx]. Test handlers that write SQL on a
// [*pgstore.Store] instead. A MemStore keeps nothing across restarts: it is
// no deduplication for production.
type MemStore struct {
	keys        *dedupetest.MemStore
	maxAttempts int
	maxResult   int

	mu   sync.Mutex
	txs  []*Tx
	held map[dedupe.Key]*Tx // TryLockKeyTx's locks, by the transaction that took them
}

var (
	_ consumer.BatchStore  = (*MemStore)(nil)
	_ httpkey.Store        = (*MemStore)(nil)
	_ dedupe.Store[pgx.Tx] = (*MemStore)(nil)
	_ Store                = (*MemStore)(nil)
)

// NewMemStore returns an empty MemStore. cfg may be nil.
func NewMemStore(cfg *MemStoreConfig) *MemStore {
	var c MemStoreConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxTxAttempts <= 0 {
		c.MaxTxAttempts = 5
	}
	if c.MaxResultBytes <= 0 {
		c.MaxResultBytes = 1 << 20
	}
	keys := dedupetest.NewMemStore()
	keys.TTL, keys.MaxResultBytes, keys.Now = c.TTL, c.MaxResultBytes, c.Now
	return &MemStore{keys: keys, maxAttempts: c.MaxTxAttempts, maxResult: c.MaxResultBytes, held: map[dedupe.Key]*Tx{}}
}

// Begin opens a transaction that claims nothing yet.
func (s *MemStore) Begin(ctx context.Context) (pgx.Tx, error) { return s.begin(ctx) }

func (s *MemStore) begin(ctx context.Context) (*Tx, error) {
	mtx, err := s.keys.Begin(ctx)
	if err != nil {
		return nil, err
	}
	tx := &Tx{mem: mtx}
	s.mu.Lock()
	s.txs = append(s.txs, tx)
	s.mu.Unlock()
	return tx, nil
}

// Transactions returns the transactions the store opened, oldest first:
// Do's and Begin's. Each reports whether it was committed or rolled back.
func (s *MemStore) Transactions() []*Tx {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Tx(nil), s.txs...)
}

// Ping implements consumer.Store: a MemStore always answers.
func (s *MemStore) Ping(context.Context) error { return nil }

// Check implements consumer.Store: a MemStore needs no table.
func (s *MemStore) Check(context.Context) error { return nil }

// KeySpace implements consumer.Store: each MemStore is a key space of its own.
func (s *MemStore) KeySpace() string { return fmt.Sprintf("consumertest.MemStore %p", s) }

// Do implements consumer.Store as [pgstore.Store.Do] does: it begins a
// transaction, claims the key, runs fn in the transaction when the claim
// says so, stores fn's result and commits. A duplicate does not run fn and
// carries the stored result. An error from fn rolls the key back and is
// returned; one marked [dedupe.Retryable] runs the transaction again, up to
// MemStoreConfig.MaxTxAttempts times.
func (s *MemStore) Do(ctx context.Context, req dedupe.Request, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (dedupe.Claim, error) {
	if err := req.Validate(); err != nil {
		return dedupe.Claim{}, err
	}
	return retrying(ctx, s.maxAttempts, func() (dedupe.Claim, error) { return s.doTx(ctx, req, fn) })
}

// retrying runs attempt until it succeeds, fails with an error not marked
// [dedupe.Retryable], ctx ends, or it ran maxAttempts times, as pgstore
// retries a transaction (without pausing between attempts).
func retrying[T any](ctx context.Context, maxAttempts int, attempt func() (T, error)) (T, error) {
	for n := 1; ; n++ {
		v, err := attempt()
		var r *dedupe.RetryableError
		if err == nil || !errors.As(err, &r) || n >= maxAttempts || ctx.Err() != nil {
			return v, err
		}
	}
}

func (s *MemStore) doTx(ctx context.Context, req dedupe.Request, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (dedupe.Claim, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return dedupe.Claim{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	c, err := s.keys.ClaimTx(ctx, tx.mem, req)
	if err != nil {
		return c, err
	}
	if c.Decision.Run() {
		result, err := fn(ctx, tx)
		if err != nil {
			return c, err
		}
		if err := s.keys.CompleteTx(ctx, tx.mem, c, result); err != nil {
			return c, err
		}
		c.Record.Result = result
	}
	return c, tx.Commit(ctx)
}

// DoLease implements consumer.Store as [pgstore.Store.DoLease] does: it
// acquires the key under lease, runs fn, and completes the key, or releases
// it when fn fails.
func (s *MemStore) DoLease(ctx context.Context, req dedupe.Request, lease time.Duration, fn func(ctx context.Context) ([]byte, error)) (dedupe.Claim, error) {
	c, err := s.Acquire(ctx, req, lease)
	if err != nil || !c.Decision.Run() {
		return c, err
	}
	result, err := fn(ctx)
	fctx := context.WithoutCancel(ctx)
	if err != nil {
		if rerr := s.Release(fctx, c); rerr != nil {
			return c, errors.Join(err, fmt.Errorf("consumertest: release after failure: %w", rerr))
		}
		return c, err
	}
	if err := s.Complete(fctx, c, result); err != nil {
		return c, err
	}
	c.Record.Result = result
	c.Record.Status = dedupe.StatusCompleted
	return c, nil
}

// own returns tx as one of s's transactions.
func (s *MemStore) own(tx pgx.Tx) (*Tx, error) {
	t, ok := tx.(*Tx)
	if !ok || t == nil {
		return nil, fmt.Errorf("consumertest: a MemStore claims only in its own transactions (MemStore.Begin), not in a %T", tx)
	}
	return t, nil
}

// ClaimTx implements dedupe.Store; tx must come from s.Begin.
func (s *MemStore) ClaimTx(ctx context.Context, tx pgx.Tx, req dedupe.Request) (dedupe.Claim, error) {
	t, err := s.own(tx)
	if err != nil {
		return dedupe.Claim{}, err
	}
	return s.keys.ClaimTx(ctx, t.mem, req)
}

// CompleteTx implements dedupe.Store; tx must come from s.Begin.
func (s *MemStore) CompleteTx(ctx context.Context, tx pgx.Tx, c dedupe.Claim, result []byte) error {
	t, err := s.own(tx)
	if err != nil {
		return err
	}
	return s.keys.CompleteTx(ctx, t.mem, c, result)
}

// Acquire implements dedupe.Store.
func (s *MemStore) Acquire(ctx context.Context, req dedupe.Request, lease time.Duration) (dedupe.Claim, error) {
	return s.keys.Acquire(ctx, req, lease)
}

// Complete implements dedupe.Store.
func (s *MemStore) Complete(ctx context.Context, c dedupe.Claim, result []byte) error {
	return s.keys.Complete(ctx, c, result)
}

// Release implements dedupe.Store.
func (s *MemStore) Release(ctx context.Context, c dedupe.Claim) error { return s.keys.Release(ctx, c) }

// Get implements dedupe.Store: the committed record of key, or an error
// wrapping dedupe.ErrNotFound.
func (s *MemStore) Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error) {
	rec, err := s.keys.Get(ctx, key)
	if err != nil {
		return rec, fmt.Errorf("consumertest: get %s: %w", key, err)
	}
	return rec, nil
}

// GetTx implements [httpkey.Store]: key's committed record, or an error
// wrapping dedupe.ErrNotFound. Unlike pgstore's GetTx on a transaction, it
// does not see a key claimed in that transaction and not yet committed.
func (s *MemStore) GetTx(ctx context.Context, _ httpkey.DBTX, key dedupe.Key) (dedupe.Record, error) {
	return s.Get(ctx, key)
}

// TryLockKeyTx implements [httpkey.Store] as pgstore's does: it takes key's
// lock for tx (one of s's transactions, from Begin) without waiting, held
// until tx commits or rolls back, and reports false when another open
// transaction holds it. Claims do not take it.
func (s *MemStore) TryLockKeyTx(_ context.Context, tx pgx.Tx, key dedupe.Key) (bool, error) {
	t, err := s.own(tx)
	if err != nil {
		return false, err
	}
	if t.Committed() || t.RolledBack() {
		return false, pgx.ErrTxClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[key]; h != nil && h != t && !h.Committed() && !h.RolledBack() {
		return false, nil
	}
	s.held[key] = t
	return true, nil
}

// MaxResultBytes implements [httpkey.Store]: MemStoreConfig.MaxResultBytes.
func (s *MemStore) MaxResultBytes() int { return s.maxResult }

// Cleanup implements dedupe.Store.
func (s *MemStore) Cleanup(ctx context.Context, cfg *dedupe.CleanupConfig) (int64, error) {
	return s.keys.Cleanup(ctx, cfg)
}

// Stats implements dedupe.Store.
func (s *MemStore) Stats(ctx context.Context) (dedupe.Stats, error) { return s.keys.Stats(ctx) }

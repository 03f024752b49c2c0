package consumertest_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
)

// TestMemStoreConformance: the MemStore, through its pgx.Tx transactions,
// passes the suite every dedupe.Store passes.
func TestMemStoreConformance(t *testing.T) {
	dedupetest.Exercise(t, func(t *testing.T) dedupetest.Harness[pgx.Tx] {
		s := consumertest.NewMemStore(&consumertest.MemStoreConfig{MaxResultBytes: 1024})
		var mu sync.Mutex
		applied := map[string]int{}
		return dedupetest.Harness[pgx.Tx]{
			Store:          s,
			Begin:          s.Begin,
			Commit:         func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback:       func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			MaxResultBytes: 1024,
			Apply: func(_ context.Context, tx pgx.Tx, id string) error {
				consumertest.TxOf(tx).OnCommit(func() { mu.Lock(); applied[id]++; mu.Unlock() })
				return nil
			},
			Applied: func(_ context.Context, id string) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return applied[id], nil
			},
		}
	})
}

// ledger is a handler that writes no SQL: it records a committed effect
// per message and returns one output message.
type ledger struct {
	runs    atomic.Int32
	mu      sync.Mutex
	applied map[string]int
	fail    error
}

func (l *ledger) handle(_ context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	l.runs.Add(1)
	if l.fail != nil {
		return nil, l.fail
	}
	consumertest.TxOf(tx).OnCommit(func() {
		l.mu.Lock()
		l.applied[msg.UUID]++
		l.mu.Unlock()
	})
	return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{"applied":true}`))}, nil
}

func (l *ledger) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[id]
}

func newLedger(t *testing.T, store consumertest.Store, cfg *consumer.Config) (*ledger, *consumertest.Handler) {
	t.Helper()
	l := &ledger{applied: map[string]int{}}
	h, err := consumertest.NewHandler(store, consumer.TxHandler(l.handle), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, h
}

func TestHandlerInMemory(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(nil)
	l, h := newLedger(t, store, nil)
	msg := message.NewMessage("m-1", []byte(`{"amount":5}`))

	r := h.Run(ctx, t, msg)
	if r.Outcome != consumer.OutcomeApplied || r.Err != nil {
		t.Fatalf("first delivery: %s, %v", r.Outcome, r.Err)
	}
	if len(r.Outputs) != 1 || r.Outputs[0].UUID != "out-m-1" {
		t.Fatalf("outputs = %v", r.Outputs)
	}
	want := dedupe.Key{Scope: consumertest.DefaultScope, ID: "m-1"}
	if !r.Stored || r.Key != want || r.Record.Status != dedupe.StatusCompleted ||
		r.Record.Fingerprint != dedupe.FingerprintOf(msg.Payload) {
		t.Fatalf("stored %v: key %v, record %+v", r.Stored, r.Key, r.Record)
	}
	if len(r.StoredOutputs) != 1 || r.StoredOutputs[0].UUID != "out-m-1" {
		t.Fatalf("stored outputs = %v", r.StoredOutputs)
	}
	if txs := store.Transactions(); len(txs) != 1 || !txs[0].Committed() {
		t.Fatalf("transactions: %d, first committed: %v", len(txs), len(txs) > 0 && txs[0].Committed())
	}

	// A duplicate does not run the handler and gets the stored outputs.
	r = h.Run(ctx, t, msg)
	if r.Outcome != consumer.OutcomeDuplicate || r.Err != nil {
		t.Fatalf("second delivery: %s, %v", r.Outcome, r.Err)
	}
	if len(r.Outputs) != 1 || r.Outputs[0].UUID != "out-m-1" {
		t.Fatalf("duplicate outputs = %v", r.Outputs)
	}
	if l.runs.Load() != 1 || l.count("m-1") != 1 {
		t.Fatalf("handler ran %d times, applied %d", l.runs.Load(), l.count("m-1"))
	}

	// The same key with another payload: key reused, never applied.
	r = h.Run(ctx, t, message.NewMessage("m-1", []byte(`{"amount":6}`)))
	var reused *dedupe.KeyReusedError
	if r.Outcome != consumer.OutcomeKeyReused || !errors.As(r.Err, &reused) || !dedupe.IsPermanent(r.Err) {
		t.Fatalf("reused key: %s, %v", r.Outcome, r.Err)
	}
	if l.runs.Load() != 1 || r.Record.Fingerprint != dedupe.FingerprintOf(msg.Payload) {
		t.Fatalf("handler ran %d times; stored fingerprint %s", l.runs.Load(), r.Record.Fingerprint)
	}
}

func TestHandlerInMemoryFailure(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(nil)
	l, h := newLedger(t, store, nil)
	l.fail = errors.New("downstream refused")
	msg := message.NewMessage("m-2", []byte(`{"amount":5}`))

	r := h.Run(ctx, t, msg)
	if r.Outcome != consumer.OutcomeFailed || !errors.Is(r.Err, l.fail) {
		t.Fatalf("failing handler: %s, %v", r.Outcome, r.Err)
	}
	if r.Stored || l.count("m-2") != 0 {
		t.Fatalf("a failed message left its key (%v) or its effect (%d)", r.Stored, l.count("m-2"))
	}
	txs := store.Transactions()
	if len(txs) != 1 || !txs[0].RolledBack() {
		t.Fatalf("transactions: %d; want one, rolled back", len(txs))
	}

	// The next delivery applies it, once.
	l.fail = nil
	if r = h.Run(ctx, t, msg); r.Outcome != consumer.OutcomeApplied || !r.Stored || l.count("m-2") != 1 {
		t.Fatalf("redelivery: %s, %v, stored %v, applied %d", r.Outcome, r.Err, r.Stored, l.count("m-2"))
	}
}

// A handler that writes SQL gets ErrNoSQL in memory, and nothing is stored.
func TestHandlerInMemoryNoSQL(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(nil)
	h, err := consumertest.NewHandler(store, consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 1")
		return nil, err
	}), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Run(ctx, t, message.NewMessage("m-3", []byte(`{}`)))
	if !errors.Is(r.Err, consumertest.ErrNoSQL) || r.Stored {
		t.Fatalf("SQL in memory: %s, %v, stored %v", r.Outcome, r.Err, r.Stored)
	}
}

func TestHandlerInMemoryLease(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(nil)
	var runs atomic.Int32
	h, err := consumertest.NewHandler(store, func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if _, ok := consumer.Tx(msg); ok {
			return nil, errors.New("a transaction in lease mode")
		}
		return []*message.Message{message.NewMessage("paid-"+msg.UUID, nil)}, nil
	}, &consumer.Config{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage("m-4", []byte(`{"pay":1}`))
	if r := h.Run(ctx, t, msg); r.Outcome != consumer.OutcomeApplied || r.Record.Status != dedupe.StatusCompleted ||
		len(r.StoredOutputs) != 1 || r.StoredOutputs[0].UUID != "paid-m-4" {
		t.Fatalf("lease: %s, %v, record %+v", r.Outcome, r.Err, r.Record)
	}
	if r := h.Run(ctx, t, msg); r.Outcome != consumer.OutcomeDuplicate || runs.Load() != 1 {
		t.Fatalf("lease duplicate: %s, %v, runs %d", r.Outcome, r.Err, runs.Load())
	}
	if txs := store.Transactions(); len(txs) != 0 {
		t.Fatalf("lease mode opened %d transactions", len(txs))
	}
}

// A handler error marked dedupe.Retryable runs the transaction again, as
// pgstore.Store.Do does.
func TestMemStoreDoRetriesRetryable(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(&consumertest.MemStoreConfig{MaxTxAttempts: 3})
	var runs int
	req := dedupetest.Req("s", "k", "p")
	c, err := store.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) {
		if runs++; runs < 3 {
			return nil, dedupe.Retryable(errors.New("serialisation failure"))
		}
		return []byte("ok"), nil
	})
	if err != nil || c.Decision != dedupe.DecisionNew || runs != 3 || string(c.Record.Result) != "ok" {
		t.Fatalf("Do = %v, %v after %d runs", c, err, runs)
	}
	if _, err := store.Do(ctx, dedupetest.Req("s", "k2", "p"), func(context.Context, pgx.Tx) ([]byte, error) {
		return nil, dedupe.Retryable(errors.New("always"))
	}); err == nil || len(store.Transactions()) != 6 {
		t.Fatalf("Do = %v after %d transactions; want an error after 3 more", err, len(store.Transactions()))
	}
}

func TestMemTx(t *testing.T) {
	ctx := context.Background()
	store := consumertest.NewMemStore(nil)
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); !errors.Is(err, consumertest.ErrNoSQL) {
		t.Fatalf("Exec: %v", err)
	}
	if _, err := tx.Query(ctx, "select 1"); !errors.Is(err, consumertest.ErrNoSQL) {
		t.Fatalf("Query: %v", err)
	}
	var n int
	if err := tx.QueryRow(ctx, "select 1").Scan(&n); !errors.Is(err, consumertest.ErrNoSQL) {
		t.Fatalf("QueryRow: %v", err)
	}
	if _, err := tx.Begin(ctx); !errors.Is(err, consumertest.ErrNoSQL) {
		t.Fatalf("Begin: %v", err)
	}
	if err := tx.SendBatch(ctx, &pgx.Batch{}).Close(); !errors.Is(err, consumertest.ErrNoSQL) {
		t.Fatalf("SendBatch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback after Commit: %v", err)
	}
	mt := consumertest.TxOf(tx)
	if !mt.Committed() || mt.RolledBack() {
		t.Fatalf("committed %v, rolled back %v", mt.Committed(), mt.RolledBack())
	}
	if _, err := store.ClaimTx(ctx, nil, dedupetest.Req("s", "k", "p")); err == nil {
		t.Fatal("ClaimTx took a transaction that is not the store's")
	}
}

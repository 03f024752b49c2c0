package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/pgstore"
)

// newStore returns a Store of the single-table layout in a fresh schema
// with an "applied" table that counts each key's committed applications.
func newStore(t testing.TB, cfg *pgstore.Config) (*pgstore.Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	var c pgstore.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema, c.Layout = db.Schema, pgstore.LayoutSingleTable
	s, err := pgstore.New(db.Pool, &c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(),
		"CREATE TABLE "+db.Table("applied")+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return s, db
}

func apply(ctx context.Context, db *pgtest.DB, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+db.Table("applied")+" (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = "+db.Table("applied")+".n + 1", id)
	return err
}

func applied(ctx context.Context, db *pgtest.DB, id string) (int, error) {
	var n int
	err := db.Pool.QueryRow(ctx, "SELECT coalesce((SELECT n FROM "+db.Table("applied")+" WHERE id = $1), 0)", id).Scan(&n)
	return n, err
}

func TestConformance(t *testing.T) {
	dedupetest.Exercise(t, func(t *testing.T) dedupetest.Harness[pgx.Tx] {
		s, db := newStore(t, &pgstore.Config{MaxResultBytes: 4096})
		return dedupetest.Harness[pgx.Tx]{
			Store:          s,
			Begin:          func(ctx context.Context) (pgx.Tx, error) { return db.Pool.Begin(ctx) },
			Commit:         func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback:       func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			Apply:          func(ctx context.Context, tx pgx.Tx, id string) error { return apply(ctx, db, tx, id) },
			Applied:        func(ctx context.Context, id string) (int, error) { return applied(ctx, db, id) },
			MaxResultBytes: 4096,
		}
	})
}

func TestConfigRejectsBadIdentifiers(t *testing.T) {
	// A pool that never connects: New reads only its configuration.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, cfg := range []pgstore.Config{
		{Table: "x; DROP TABLE y"},
		{Schema: `public"."x`},
		{Table: "1abc"},
		{Schema: strings.Repeat("s", 64)},
	} {
		_, err := pgstore.New(pool, &cfg)
		if err == nil || !strings.Contains(err.Error(), "not a valid identifier") {
			t.Errorf("New(%+v) err = %v, want a clear identifier error", cfg, err)
		}
	}
	for _, cfg := range []pgstore.Config{{TTL: -time.Second}, {MaxTxAttempts: -1}, {IsoLevel: "chaos"}} {
		if _, err := pgstore.New(pool, &cfg); err == nil || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("New(%+v) err = %v, want an error naming the field", cfg, err)
		}
	}
	if _, err := pgstore.New(nil, nil); err == nil {
		t.Error("New(nil pool) succeeded")
	}
}

// TestSchemaIsHonoured: the store finds its table only through the
// configured schema (the test pool's search_path is pg_catalog).
func TestSchemaIsHonoured(t *testing.T) {
	db := pgtest.New(t)
	s, err := pgstore.New(db.Pool, nil) // Schema defaults to public: no table there
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Do(context.Background(), dedupetest.Req("s", "id", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("err = %v, want the missing public table", err)
	}
	other := pgtest.NewEmpty(t)
	s2, _ := pgstore.New(db.Pool, &pgstore.Config{Schema: other.Schema, Layout: pgstore.LayoutSingleTable})
	if _, err := s2.Get(context.Background(), dedupe.Key{Scope: "s", ID: "x"}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("unmigrated schema err = %v", err)
	}
}

// countingTracer counts the round trips (n) and the statements (stmts)
// sent on a pool.
type countingTracer struct{ n, stmts atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.stmts.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch is one round trip.
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.stmts.Add(1)
}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracedPool is a pool of its own whose round trips tracer counts.
func tracedPool(t *testing.T, maxConns int32) (*pgxpool.Pool, *countingTracer) {
	t.Helper()
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, tracer
}

// TestRoundTrips checks the round-trip budget: a new message costs one
// statement before the handler and at most one after; a duplicate costs one.
func TestRoundTrips(t *testing.T) {
	db := pgtest.New(t)
	pool, tracer := tracedPool(t, 2)
	s, _ := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	ctx := context.Background()
	count := func(req dedupe.Request, result []byte) (claim, complete int64, outcome dedupe.Decision) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		before := tracer.n.Load()
		c, err := s.ClaimTx(ctx, tx, req)
		if err != nil {
			t.Fatal(err)
		}
		claim = tracer.n.Load() - before
		if c.Decision.Run() {
			before = tracer.n.Load()
			if err := s.CompleteTx(ctx, tx, c, result); err != nil {
				t.Fatal(err)
			}
			complete = tracer.n.Load() - before
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return claim, complete, c.Decision
	}
	if c, d, o := count(dedupetest.Req("s", "a", "p"), nil); c != 1 || d != 0 || o != dedupe.DecisionNew {
		t.Errorf("new, no result: %d + %d statements (%v), want 1 + 0", c, d, o)
	}
	if c, d, o := count(dedupetest.Req("s", "b", "p"), []byte("r")); c != 1 || d != 1 || o != dedupe.DecisionNew {
		t.Errorf("new with result: %d + %d statements (%v), want 1 + 1", c, d, o)
	}
	if c, d, o := count(dedupetest.Req("s", "b", "p"), nil); c != 1 || d != 0 || o != dedupe.DecisionDuplicate {
		t.Errorf("duplicate: %d statements (%v), want 1", c, o)
	}
}

// TestDoRoundTrips checks Do's round-trip budget: BEGIN goes with the
// claim, so a new message costs two round trips (three with a result to
// store) and a duplicate two.
func TestDoRoundTrips(t *testing.T) {
	db := pgtest.New(t)
	pool, tracer := tracedPool(t, 1)
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	for _, c := range []struct {
		name, id string
		result   []byte
		want     int64
	}{{"new, no result", "a", nil, 2}, {"duplicate", "a", nil, 2}, {"new with result", "b", []byte("r"), 3}, {"duplicate with result", "b", []byte("r"), 2}} {
		before := tracer.n.Load()
		if _, err := s.Do(ctx, dedupetest.Req("s", c.id, "p"), func(context.Context, pgx.Tx) ([]byte, error) { return c.result, nil }); err != nil {
			t.Fatal(err)
		}
		if got := tracer.n.Load() - before; got != c.want {
			t.Errorf("%s: %d round trips, want %d", c.name, got, c.want)
		}
	}
}

// TestRepeatableReadSerializationFailureIsRetryable: a caller in REPEATABLE
// READ whose claim waited for a concurrent claim of the same key gets a
// serialisation failure, classified retryable; Do retries it into a duplicate.
func TestRepeatableReadSerializationFailureIsRetryable(t *testing.T) {
	s, db := newStore(t, &pgstore.Config{IsoLevel: pgx.RepeatableRead})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := dedupetest.Req("s", "k", "p")

	first, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if _, err := s.ClaimTx(ctx, first, req); err != nil {
		t.Fatal(err)
	}
	second, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(ctx)
	var pid int
	if err := second.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil { // also takes the snapshot
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := s.ClaimTx(ctx, second, req); errc <- err }()
	testenv.WaitFor(t, 10*time.Second, "the second claim to wait on the first's key", func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		return err == nil && waiting
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-errc
	if !dedupe.IsRetryable(err) || !pgstore.IsRetryableError(err) {
		t.Fatalf("err = %v, want a retryable serialisation failure", err)
	}
	if !strings.Contains(err.Error(), "40001") {
		t.Fatalf("err = %v, want SQLSTATE 40001", err)
	}

	// Do at REPEATABLE READ: 8 workers on one key, exactly one applies.
	var wg sync.WaitGroup
	var dup atomic.Int64
	req2 := dedupetest.Req("s", "k2", "p")
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := s.Do(ctx, req2, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				return []byte("r"), apply(ctx, db, tx, req2.Key.String())
			})
			if err != nil {
				t.Error(err)
			}
			if c.Decision == dedupe.DecisionDuplicate {
				dup.Add(1)
			}
		}()
	}
	wg.Wait()
	if n, _ := applied(ctx, db, req2.Key.String()); n != 1 || dup.Load() != 7 {
		t.Fatalf("applied %d times, %d duplicates; want 1 and 7", n, dup.Load())
	}
}

func TestDo(t *testing.T) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	req := dedupetest.Req("s", "k", `{"a":1}`)
	boom := errors.New("boom")
	_, err := s.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if err := apply(ctx, db, tx, "k"); err != nil {
			return nil, err
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the handler's error", err)
	}
	if n, _ := applied(ctx, db, "k"); n != 0 {
		t.Fatalf("failed handler's write committed: %d", n)
	}
	for i := 0; i < 3; i++ {
		c, err := s.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return []byte("result"), apply(ctx, db, tx, "k")
		})
		if err != nil || string(c.Record.Result) != "result" {
			t.Fatalf("Do %d: %q %v", i, c.Record.Result, err)
		}
	}
	if n, _ := applied(ctx, db, "k"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	// A handler statement that hits a deadlock-class error is retried.
	var calls atomic.Int64
	c, err := s.Do(ctx, dedupetest.Req("s", "retry", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if calls.Add(1) == 1 {
			_, err := tx.Exec(ctx, "DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '40P01'; END $$")
			return nil, err
		}
		return nil, apply(ctx, db, tx, "retry")
	})
	if err != nil || c.Decision != dedupe.DecisionNew || calls.Load() != 2 {
		t.Fatalf("deadlock retry: %v %v calls=%d", c.Decision, err, calls.Load())
	}
}

func TestDoLease(t *testing.T) {
	s, _ := newStore(t, nil)
	ctx := context.Background()
	req := dedupetest.Req("payments", "p-1", "p")
	var calls atomic.Int64
	fail := errors.New("payment API down")
	_, err := s.DoLease(ctx, req, time.Minute, func(context.Context) ([]byte, error) { calls.Add(1); return nil, fail })
	if !errors.Is(err, fail) {
		t.Fatal(err)
	}
	c, err := s.DoLease(ctx, req, time.Minute, func(context.Context) ([]byte, error) { calls.Add(1); return []byte("paid"), nil })
	if err != nil || c.Decision != dedupe.DecisionTakeover || c.Record.Attempts != 2 {
		t.Fatalf("after release: %v attempts %d %v", c.Decision, c.Record.Attempts, err)
	}
	c, err = s.DoLease(ctx, req, time.Minute, func(context.Context) ([]byte, error) { calls.Add(1); return nil, nil })
	if err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "paid" || calls.Load() != 2 {
		t.Fatalf("duplicate: %v %q %v calls=%d", c.Decision, c.Record.Result, err, calls.Load())
	}
}

func TestClosedPoolAndCancelledContext(t *testing.T) {
	db := pgtest.New(t)
	u, _ := pgtest.URL()
	cfg, _ := pgtest.Config(u)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	pool.Close()
	ctx := context.Background()
	_, err = s.Do(ctx, dedupetest.Req("s", "k", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if err == nil || !strings.Contains(err.Error(), "pgstore: begin") || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("closed pool err = %v", err)
	}
	if _, err := s.Acquire(ctx, dedupetest.Req("s", "k", "p"), time.Minute); err == nil || !strings.HasPrefix(err.Error(), "pgstore: ") {
		t.Fatalf("closed pool Acquire err = %v", err)
	}

	s2, _ := newStore(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	var ran bool
	_, err = s2.Do(cctx, dedupetest.Req("s", "k", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		ran = true
		cancel()
		return nil, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || !ran {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, err := s2.Get(ctx, dedupe.Key{Scope: "s", ID: "k"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("cancelled run left a key: %v", err)
	}
}

// TestCleanupDoesNotHoldUpClaims: cleanup skips rows a claim holds and never
// makes a claim wait; claims of fresh keys run while a large cleanup deletes.
func TestCleanupDoesNotHoldUpClaims(t *testing.T) {
	s, db := newStore(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const expired = 20000
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (scope, key, fingerprint, status, expires_at)
		SELECT 's', 'old-' || g, repeat('a', 64), 'COMPLETED', now() - interval '1 hour' FROM generate_series(1, %d) g`,
		db.Table("exactly_keys"), expired)); err != nil {
		t.Fatal(err)
	}
	// A transaction holds one expired key (a redelivery of it is being decided).
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "SELECT 1 FROM "+db.Table("exactly_keys")+" WHERE scope='s' AND key='old-7' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var deleted int64
	var cleanErr error
	go func() {
		defer close(done)
		deleted, cleanErr = s.Cleanup(ctx, &dedupe.CleanupConfig{BatchSize: 500})
	}()
	// Claims of new keys go on while cleanup runs.
	for i := 0; i < 50; i++ {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.Do(cctx, dedupetest.Req("s", fmt.Sprint("new-", i), "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return nil, apply(ctx, db, tx, fmt.Sprint("new-", i))
		})
		ccancel()
		if err != nil {
			t.Fatalf("claim during cleanup: %v", err)
		}
	}
	<-done
	if cleanErr != nil || deleted != expired-1 {
		t.Fatalf("Cleanup = %d, %v; want %d (all but the held key)", deleted, cleanErr, expired-1)
	}
	if _, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: "old-7"}); err != nil {
		t.Fatalf("held key: %v", err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Completed != 51 || st.TableBytes <= 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

// Do's transaction (BEGIN sent with the claim) behaves as pgx's: a
// nested Begin is a savepoint, and the transaction is closed after Do.
func TestDoTransactionSemantics(t *testing.T) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	var kept pgx.Tx
	_, err := s.Do(ctx, dedupetest.Req("s", "nested", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		kept = tx
		if err := apply(ctx, db, tx, "outer"); err != nil {
			return nil, err
		}
		inner, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := apply(ctx, db, inner, "rolled-back"); err != nil {
			return nil, err
		}
		if err := inner.Rollback(ctx); err != nil {
			return nil, err
		}
		inner2, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := apply(ctx, db, inner2, "released"); err != nil {
			return nil, err
		}
		if err := inner2.Commit(ctx); err != nil {
			return nil, err
		}
		b := &pgx.Batch{}
		b.Queue("SELECT 1")
		return nil, tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{"outer": 1, "rolled-back": 0, "released": 1} {
		if n, err := applied(ctx, db, id); err != nil || n != want {
			t.Errorf("%s applied %d times (%v), want %d", id, n, err, want)
		}
	}
	if _, err := kept.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Exec after Do: %v, want ErrTxClosed", err)
	}
	if err := kept.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Commit after Do: %v, want ErrTxClosed", err)
	}
	// A statement error aborts the transaction; Do reports it and the
	// connection goes back to the pool usable.
	_, err = s.Do(ctx, dedupetest.Req("s", "broken", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "SELECT 1/0")
		return nil, err
	})
	if err == nil || !strings.Contains(err.Error(), "22012") {
		t.Fatalf("err = %v, want division by zero", err)
	}
	for i := 0; i < 10; i++ { // every pooled connection is idle and usable again
		if _, err := s.Do(ctx, dedupetest.Req("s", fmt.Sprint("after-", i), "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
}

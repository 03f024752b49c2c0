package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// applyBatch applies the fresh requests' ids in one statement and returns
// "r:<id>" as each one's result.
func applyBatch(db *pgtest.DB, reqs []dedupe.Request, calls *atomic.Int64) pgstore.BatchFunc {
	return func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
		if calls != nil {
			calls.Add(1)
		}
		ids := make([]string, len(fresh))
		results := make([][]byte, len(fresh))
		for j, i := range fresh {
			ids[j] = reqs[i].Key.ID
			results[j] = []byte("r:" + reqs[i].Key.ID)
		}
		t := db.Table("applied")
		_, err := tx.Exec(ctx, "INSERT INTO "+t+" (id, n) SELECT id, count(*) FROM unnest($1::text[]) AS id GROUP BY id ORDER BY id "+
			"ON CONFLICT (id) DO UPDATE SET n = "+t+".n + excluded.n", ids)
		return results, err
	}
}

// storeMaker returns a store on a fresh schema, with an "applied" table.
type storeMaker func(testing.TB, *pgstore.Config) (*pgstore.Store, *pgtest.DB)

// eachLayout runs test on both key layouts, in parallel; the partitioned
// store has its partitions (Check) and no legacy table to probe.
func eachLayout(t *testing.T, test func(*testing.T, storeMaker)) {
	t.Parallel()
	for _, l := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
		t.Run(l.String(), func(t *testing.T) {
			t.Parallel()
			test(t, storeMakers[l])
		})
	}
}

var storeMakers = map[pgstore.Layout]storeMaker{
	pgstore.LayoutSingleTable: newStore,
	pgstore.LayoutPartitioned: func(tb testing.TB, cfg *pgstore.Config) (*pgstore.Store, *pgtest.DB) {
		s, _, db := newPartitioned(tb, cfg, "")
		if err := s.Check(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return s, db
	},
}

// appliedCounts reads the applied table: how many ids were applied, how
// many applications there were in all, and how many ids were applied more
// than once.
func appliedCounts(t *testing.T, db *pgtest.DB) (ids, total, over int) {
	t.Helper()
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*), coalesce(sum(n), 0), count(*) FILTER (WHERE n > 1) FROM "+
		db.Table("applied")).Scan(&ids, &total, &over); err != nil {
		t.Fatal(err)
	}
	return ids, total, over
}

func reqsOf(scope string, ids ...string) []dedupe.Request {
	out := make([]dedupe.Request, len(ids))
	for i, id := range ids {
		out[i] = dedupetest.Req(scope, id, "payload of "+id)
	}
	return out
}

func wantApplied(t *testing.T, db *pgtest.DB, want map[string]int) {
	t.Helper()
	for id, n := range want {
		if got, err := applied(context.Background(), db, id); err != nil || got != n {
			t.Errorf("%s applied %d times (%v), want %d", id, got, err, n)
		}
	}
}

func TestDoBatchFreshThenDuplicates(t *testing.T) { eachLayout(t, testDoBatchFreshThenDuplicates) }

func testDoBatchFreshThenDuplicates(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	reqs := reqsOf("s", "c", "a", "b")
	out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range out {
		if c.Err != nil || c.Decision != dedupe.DecisionNew || string(c.Record.Result) != "r:"+reqs[i].Key.ID {
			t.Errorf("%d: %v %q %v, want new with its result", i, c.Decision, c.Record.Result, c.Err)
		}
	}
	// Redelivered with a new key among them: only the new one runs; the
	// others come back as duplicates with their stored results.
	again := append(reqsOf("s", "b", "d"), reqs[0], reqs[1])
	var fresh []int
	out, err = s.DoBatch(ctx, again, func(ctx context.Context, tx pgx.Tx, f []int) ([][]byte, error) {
		fresh = f
		return applyBatch(db, again, nil)(ctx, tx, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, []int{1}) {
		t.Fatalf("fn got %v, want [1] (d alone)", fresh)
	}
	for i, c := range out {
		want := dedupe.DecisionDuplicate
		if i == 1 {
			want = dedupe.DecisionNew
		}
		if c.Err != nil || c.Decision != want || string(c.Record.Result) != "r:"+again[i].Key.ID {
			t.Errorf("%s: %v %q %v, want %v with its result", again[i].Key.ID, c.Decision, c.Record.Result, c.Err, want)
		}
	}
	// All duplicates: fn does not run.
	out, err = s.DoBatch(ctx, reqs, func(context.Context, pgx.Tx, []int) ([][]byte, error) {
		t.Error("fn ran for a batch of duplicates")
		return nil, nil
	})
	if err != nil || out[0].Decision != dedupe.DecisionDuplicate {
		t.Fatalf("all duplicates: %v %v", out, err)
	}
	wantApplied(t, db, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1})
}

// A key reused with another payload, an invalid key and a key held under a
// lease are answered per request; the rest of the batch applies.
func TestDoBatchPerRequestErrors(t *testing.T) { eachLayout(t, testDoBatchPerRequestErrors) }

func testDoBatchPerRequestErrors(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	if _, err := s.DoBatch(ctx, reqsOf("s", "old"), applyBatch(db, reqsOf("s", "old"), nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, dedupetest.Req("s", "leased", "payload of leased"), time.Hour); err != nil {
		t.Fatal(err)
	}
	reqs := []dedupe.Request{
		dedupetest.Req("s", "old", "another payload"),
		dedupetest.Req("s", "", "no id"),
		dedupetest.Req("s", "leased", "payload of leased"),
		dedupetest.Req("s", "new", "payload of new"),
	}
	var fresh []int
	out, err := s.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, f []int) ([][]byte, error) {
		fresh = f
		return applyBatch(db, reqs, nil)(ctx, tx, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	var reused *dedupe.KeyReusedError
	var inflight *dedupe.InFlightError
	switch {
	case !errors.As(out[0].Err, &reused) || reused.Stored != dedupetest.Req("s", "old", "payload of old").Fingerprint:
		t.Errorf("reused key: %v", out[0].Err)
	case !errors.Is(out[1].Err, dedupe.ErrInvalidKey) || !dedupe.IsPermanent(out[1].Err):
		t.Errorf("invalid key: %v", out[1].Err)
	case !errors.As(out[2].Err, &inflight) || !dedupe.IsRetryable(out[2].Err):
		t.Errorf("leased key: %v", out[2].Err)
	case out[3].Err != nil || out[3].Decision != dedupe.DecisionNew:
		t.Errorf("new key: %v %v", out[3].Decision, out[3].Err)
	case !slices.Equal(fresh, []int{3}):
		t.Errorf("fn got %v, want [3]", fresh)
	}
	wantApplied(t, db, map[string]int{"old": 1, "leased": 0, "new": 1})
	if rec, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: "old"}); err != nil || rec.Fingerprint != reused.Stored {
		t.Errorf("the reused key's record changed: %v %v", rec.Fingerprint, err)
	}
}

// A lease that expired (a lease-mode worker crashed) is taken over by the
// batch, fenced, with Attempts+1.
func TestDoBatchTakesOverExpiredLease(t *testing.T) { eachLayout(t, testDoBatchTakesOverExpiredLease) }

func testDoBatchTakesOverExpiredLease(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	req := dedupetest.Req("s", "crashed", "payload of crashed")
	if _, err := s.Acquire(ctx, req, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	reqs := []dedupe.Request{req, dedupetest.Req("s", "other", "payload of other")}
	out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Err != nil || out[0].Decision != dedupe.DecisionTakeover || out[0].Record.Attempts != 2 || out[1].Decision != dedupe.DecisionNew {
		t.Fatalf("got %+v / %+v, want a takeover at attempt 2 and a new key", out[0], out[1])
	}
	rec, err := s.Get(ctx, req.Key)
	if err != nil || rec.Status != dedupe.StatusCompleted || string(rec.Result) != "r:crashed" {
		t.Fatalf("record after takeover: %+v %v", rec, err)
	}
	wantApplied(t, db, map[string]int{"crashed": 1, "other": 1})
}

// The same key twice or more in one batch: the first claims it, the later
// copies are its duplicates (same payload, with its result) or key reuses.
func TestDoBatchSameKeyTwice(t *testing.T) { eachLayout(t, testDoBatchSameKeyTwice) }

func testDoBatchSameKeyTwice(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	reqs := []dedupe.Request{
		dedupetest.Req("s", "k", "payload of k"),
		dedupetest.Req("s", "x", "payload of x"),
		dedupetest.Req("s", "k", "payload of k"),
		dedupetest.Req("s", "k", "another payload"),
	}
	var fresh []int
	out, err := s.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, f []int) ([][]byte, error) {
		fresh = f
		return applyBatch(db, reqs, nil)(ctx, tx, f)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, []int{0, 1}) {
		t.Fatalf("fn got %v, want [0 1]", fresh)
	}
	if out[2].Err != nil || out[2].Decision != dedupe.DecisionDuplicate || string(out[2].Record.Result) != "r:k" {
		t.Errorf("second copy: %v %q %v, want a duplicate with the first's result", out[2].Decision, out[2].Record.Result, out[2].Err)
	}
	if !errors.Is(out[3].Err, dedupe.ErrKeyReused) {
		t.Errorf("copy with another payload: %v, want key reused", out[3].Err)
	}
	wantApplied(t, db, map[string]int{"k": 1, "x": 1})

	// Stored already: a copy with the stored payload after one that reuses
	// the key is still a duplicate.
	reqs = []dedupe.Request{dedupetest.Req("s", "k", "another payload"), dedupetest.Req("s", "k", "payload of k")}
	out, err = s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
	if err != nil || !errors.Is(out[0].Err, dedupe.ErrKeyReused) || !errors.Is(out[1].Err, pgstore.ErrClaimAlone) {
		t.Fatalf("got %+v %v, want key reused, then a copy to claim alone", out, err)
	}
	wantApplied(t, db, map[string]int{"k": 1})
	alone, err := s.DoBatch(ctx, reqs[1:], applyBatch(db, reqs[1:], nil))
	if err != nil || alone[0].Err != nil || alone[0].Decision != dedupe.DecisionDuplicate || string(alone[0].Record.Result) != "r:k" {
		t.Fatalf("claimed alone: %+v %v, want a duplicate with the stored result", alone, err)
	}
}

// A copy of a key after one that reuses it is decided against the stored
// key alone, never against a record made up for it: under a valid lease it
// is in flight, after an expired lease it takes the key over and applies.
func TestDoBatchCopyAfterReuseOfLeasedKey(t *testing.T) {
	eachLayout(t, testDoBatchCopyAfterReuseOfLeasedKey)
}

func testDoBatchCopyAfterReuseOfLeasedKey(t *testing.T, newStore storeMaker) {
	for _, tc := range []struct {
		name  string
		lease time.Duration
		want  func(pgstore.BatchClaim) bool
		n     int
	}{
		{"valid lease", time.Minute, func(c pgstore.BatchClaim) bool { return errors.Is(c.Err, dedupe.ErrInFlight) }, 0},
		{"expired lease", time.Millisecond, func(c pgstore.BatchClaim) bool { return c.Err == nil && c.Decision == dedupe.DecisionTakeover }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, db := newStore(t, nil)
			ctx := context.Background()
			acquired := time.Now()
			if _, err := s.Acquire(ctx, dedupetest.Req("s", "k", "payload of k"), tc.lease); err != nil {
				t.Fatal(err)
			}
			for tc.lease < time.Second && time.Since(acquired) < 20*tc.lease {
				time.Sleep(time.Millisecond) // the lease runs out
			}
			reqs := []dedupe.Request{dedupetest.Req("s", "k", "another payload"), dedupetest.Req("s", "k", "payload of k")}
			out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
			if err != nil || !errors.Is(out[0].Err, dedupe.ErrKeyReused) || !errors.Is(out[1].Err, pgstore.ErrClaimAlone) {
				t.Fatalf("got %+v %v, want key reused, then a copy to claim alone", out, err)
			}
			wantApplied(t, db, map[string]int{"k": 0})
			alone, err := s.DoBatch(ctx, reqs[1:], applyBatch(db, reqs[1:], nil))
			if err != nil || !tc.want(alone[0]) {
				t.Fatalf("claimed alone: %+v %v", alone, err)
			}
			wantApplied(t, db, map[string]int{"k": tc.n})
		})
	}
}

// A failing fn rolls back the whole batch, keys included.
func TestDoBatchFnErrorRollsBack(t *testing.T) { eachLayout(t, testDoBatchFnErrorRollsBack) }

func testDoBatchFnErrorRollsBack(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	reqs := reqsOf("s", "a", "b")
	boom := errors.New("boom")
	if _, err := s.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, f []int) ([][]byte, error) {
		if _, err := applyBatch(db, reqs, nil)(ctx, tx, f); err != nil {
			return nil, err
		}
		return nil, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's", err)
	}
	for _, r := range reqs {
		if _, err := s.Get(ctx, r.Key); !errors.Is(err, dedupe.ErrNotFound) {
			t.Errorf("%s stored after a rollback: %v", r.Key, err)
		}
	}
	out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
	if err != nil || out[0].Decision != dedupe.DecisionNew || out[1].Decision != dedupe.DecisionNew {
		t.Fatalf("redelivery: %+v %v", out, err)
	}
	wantApplied(t, db, map[string]int{"a": 1, "b": 1})
}

// The connection dies after fn wrote and before COMMIT: nothing is stored;
// the whole transaction runs again, and every message applies once.
func TestDoBatchConnectionKilledBeforeCommit(t *testing.T) {
	eachLayout(t, testDoBatchConnectionKilledBeforeCommit)
}

func testDoBatchConnectionKilledBeforeCommit(t *testing.T, newStore storeMaker) {
	for _, attempts := range []int{1, 5} {
		t.Run(fmt.Sprintf("MaxTxAttempts=%d", attempts), func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, &pgstore.Config{MaxTxAttempts: attempts, RetryBackoff: time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reqs := reqsOf("s", "a", "b", "c")
			var calls atomic.Int64
			kill := func(ctx context.Context, tx pgx.Tx, f []int) ([][]byte, error) {
				res, err := applyBatch(db, reqs, &calls)(ctx, tx, f)
				if err != nil || calls.Load() > 1 {
					return res, err
				}
				var pid int
				if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return nil, err
				}
				_, err = db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
				return res, err
			}
			out, err := s.DoBatch(ctx, reqs, kill)
			if attempts == 1 {
				if err == nil || !dedupe.IsRetryable(err) {
					t.Fatalf("err = %v, want a retryable error", err)
				}
				for _, r := range reqs {
					if _, err := s.Get(ctx, r.Key); !errors.Is(err, dedupe.ErrNotFound) {
						t.Errorf("%s stored by a transaction that never committed: %v", r.Key, err)
					}
				}
				wantApplied(t, db, map[string]int{"a": 0, "b": 0, "c": 0})
				out, err = s.DoBatch(ctx, reqs, kill) // the redelivery
			}
			if err != nil || calls.Load() != 2 {
				t.Fatalf("err = %v after %d runs of fn, want success after 2", err, calls.Load())
			}
			for _, c := range out {
				if c.Decision != dedupe.DecisionNew {
					t.Errorf("%s: %v, want new", c.Record.Key, c.Decision)
				}
			}
			wantApplied(t, db, map[string]int{"a": 1, "b": 1, "c": 1})
		})
	}
}

// The COMMIT's answer is lost: DoBatch runs the transaction again, finds
// the keys that its own unanswered COMMIT wrote, and reports them as new.
func TestDoBatchCommitAnswerLost(t *testing.T) { eachLayout(t, testDoBatchCommitAnswerLost) }

func testDoBatchCommitAnswerLost(t *testing.T, newStore storeMaker) {
	s0, db := newStore(t, nil)
	d := pgtest.NewCommitDropper(t)
	s, err := pgstore.New(d.Pool(t), &pgstore.Config{Schema: db.Schema, RetryBackoff: time.Millisecond, Layout: s0.Config().Layout})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reqs := reqsOf("s", "a", "b")
	var calls atomic.Int64
	d.Arm()
	out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, &calls))
	if d.Dropped() != 1 {
		t.Fatalf("the COMMIT's answer was dropped %d times, want 1", d.Dropped())
	}
	if err != nil || calls.Load() != 1 {
		t.Fatalf("err = %v, fn ran %d times; want success, once", err, calls.Load())
	}
	for _, c := range out {
		if c.Decision != dedupe.DecisionNew || string(c.Record.Result) != "r:"+c.Record.Key.ID {
			t.Errorf("%s: %v %q, want new with its result", c.Record.Key, c.Decision, c.Record.Result)
		}
	}
	wantApplied(t, db, map[string]int{"a": 1, "b": 1})
}

// Batches over overlapping keys, in different orders, at once: every key
// is applied once, and no batch fails (claims are sorted by key, so they
// wait for each other instead of deadlocking).
func TestDoBatchConcurrentOverlapping(t *testing.T) { eachLayout(t, testDoBatchConcurrentOverlapping) }

func testDoBatchConcurrentOverlapping(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const keys, workers, rounds = 200, 6, 8
	var all []dedupe.Request
	for i := range keys {
		all = append(all, dedupetest.Req("s", fmt.Sprintf("k%03d", i), fmt.Sprintf("payload %d", i)))
	}
	var wg sync.WaitGroup
	var appliedByUs, dups atomic.Int64
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				batch := slices.Clone(all)
				rnd.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				batch = batch[:100]
				out, err := s.DoBatch(ctx, batch, applyBatch(db, batch, nil))
				if err != nil {
					errs <- err
					return
				}
				for _, c := range out {
					switch {
					case c.Err != nil:
						errs <- c.Err
					case c.Decision == dedupe.DecisionNew:
						appliedByUs.Add(1)
					case c.Decision == dedupe.DecisionDuplicate:
						dups.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rows, total, over := appliedCounts(t, db)
	if over != 0 || int64(total) != appliedByUs.Load() || appliedByUs.Load()+dups.Load() != workers*rounds*100 {
		t.Fatalf("%d ids applied %d times in all, %d of them more than once; batches reported %d new, %d duplicates",
			rows, total, over, appliedByUs.Load(), dups.Load())
	}
}

// TestDoBatchAnswersTheStoredRecords checks that the record each claim of
// a batch answers is the row stored for it, when every key is new (the
// batch statement then answers one row for all) and when some are not.
func TestDoBatchAnswersTheStoredRecords(t *testing.T) {
	eachLayout(t, testDoBatchAnswersTheStoredRecords)
}

func testDoBatchAnswersTheStoredRecords(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	mk := func(id string, ttl time.Duration, src dedupe.Source) dedupe.Request {
		r := dedupetest.Req("s", id, "payload of "+id)
		r.TTL, r.Source = ttl, src
		return r
	}
	v7 := func() string { return uuid.Must(uuid.NewV7()).String() }
	batch := func(reqs []dedupe.Request, want []dedupe.Decision) {
		t.Helper()
		out, err := s.DoBatch(ctx, reqs, func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil })
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range out {
			if c.Err != nil || c.Decision != want[i] {
				t.Fatalf("%s: %v %v, want %v", reqs[i].Key, c.Decision, c.Err, want[i])
			}
			got, err := s.Get(ctx, reqs[i].Key)
			if err != nil {
				t.Fatal(err)
			}
			r := c.Record
			if r.Key != got.Key || r.Fingerprint != got.Fingerprint || r.Status != got.Status || r.Attempts != got.Attempts ||
				r.Source != got.Source || !r.CreatedAt.Equal(got.CreatedAt) || !r.CompletedAt.Equal(got.CompletedAt) ||
				!r.ExpiresAt.Equal(got.ExpiresAt) || !r.LockedUntil.Equal(got.LockedUntil) || r.Result != nil || got.Result != nil {
				t.Errorf("%s: the claim answered\n%+v\nthe store holds\n%+v", reqs[i].Key, r, got)
			}
		}
	}
	src := dedupe.Source{Topic: "orders", Partition: 4, Offset: 1234567}
	first := []dedupe.Request{
		mk(v7(), 0, src), mk(uuid.NewString(), 90*time.Minute+1500*time.Nanosecond, dedupe.Source{}),
		mk("order-17", 72*time.Hour, src), mk(v7(), time.Second+999*time.Nanosecond, dedupe.Source{Topic: "other", Offset: 9}),
	}
	n := dedupe.DecisionNew
	batch(first, []dedupe.Decision{n, n, n, n})
	mixed := []dedupe.Request{first[1], mk(v7(), 5*time.Minute, src), first[2], mk("order-18", 0, dedupe.Source{})}
	batch(mixed, []dedupe.Decision{dedupe.DecisionDuplicate, n, dedupe.DecisionDuplicate, n})
	// Columns that hold a value in every row of a batch, or NULL in every
	// row (no source, no ID text), in batches of new keys and in batches
	// with stored keys among new ones.
	other := dedupe.Source{Topic: "orders", Partition: 2, Offset: 77}
	sourced := []dedupe.Request{mk(v7(), 0, src), mk(v7(), time.Hour, other), mk(uuid.NewString(), 0, src)}
	batch(sourced, []dedupe.Decision{n, n, n})
	bare := []dedupe.Request{mk(v7(), 0, dedupe.Source{}), mk(uuid.NewString(), time.Minute, dedupe.Source{})}
	batch(bare, []dedupe.Decision{n, n})
	d := dedupe.DecisionDuplicate
	batch([]dedupe.Request{sourced[1], mk(v7(), 0, other), sourced[0]}, []dedupe.Decision{d, n, d})
	batch([]dedupe.Request{mk(v7(), 0, dedupe.Source{}), bare[0], bare[1]}, []dedupe.Decision{n, d, d})
	if !strings.HasSuffix(t.Name(), "/partitioned") {
		return
	}
	// What a record cannot tell apart, the row can: a key without a source
	// stores NULL there, not a zero, and only a text ID stores its text.
	var keys, unsourced, texts int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE source_topic IS NULL AND source_partition IS NULL AND source_offset IS NULL), "+
		"count(id_text) FROM "+db.Table("exactly_keys2")).Scan(&keys, &unsourced, &texts); err != nil {
		t.Fatal(err)
	}
	if keys != 13 || unsourced != 5 || texts != 2 {
		t.Errorf("%d keys stored, %d without a source, %d with an ID text; want 13, 5 and 2", keys, unsourced, texts)
	}
}

// TestDoBatchIsolationLevels runs a batch of new keys, a batch with stored
// keys among new ones and that batch again at each isolation level
// Config.IsoLevel takes: each key applied once, with its stored result
// for the duplicates.
func TestDoBatchIsolationLevels(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			eachLayout(t, func(t *testing.T, newStore storeMaker) {
				s, db := newStore(t, &pgstore.Config{IsoLevel: iso})
				ctx := context.Background()
				v7 := func() string { return uuid.Must(uuid.NewV7()).String() }
				run := func(reqs []dedupe.Request, want ...dedupe.Decision) {
					t.Helper()
					out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
					if err != nil {
						t.Fatal(err)
					}
					for i, c := range out {
						if c.Err != nil || c.Decision != want[i] || string(c.Record.Result) != "r:"+reqs[i].Key.ID {
							t.Fatalf("%s: %v %q %v, want %v with its result", reqs[i].Key, c.Decision, c.Record.Result, c.Err, want[i])
						}
					}
				}
				n, d := dedupe.DecisionNew, dedupe.DecisionDuplicate
				first := reqsOf("s", v7(), v7(), "order-1")
				run(first, n, n, n)
				mixed := append(reqsOf("s", v7()), first[0], first[2])
				run(mixed, n, d, d)
				run(mixed, d, d, d)
				want := map[string]int{}
				for _, r := range append(first, mixed[0]) {
					want[r.Key.ID] = 1
				}
				wantApplied(t, db, want)
			})
		})
	}
}

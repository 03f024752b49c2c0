package pgstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/pgstore"
)

// newPartitioned returns a partitioned store on a fresh schema, its
// partitions created by Check, and a legacy store on the same schema.
func newPartitioned(t testing.TB, cfg *pgstore.Config, width string) (*pgstore.Store, *pgstore.Store, *pgtest.DB) {
	t.Helper()
	db := pgtest.New(t)
	ctx := context.Background()
	if width != "" {
		if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys2_state")+" SET width = $1::interval", width); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("applied")+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var c pgstore.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema, c.Layout, c.Logger = db.Schema, pgstore.LayoutPartitioned, slog.New(slog.DiscardHandler)
	s, err := pgstore.New(db.Pool, &c)
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	return s, legacy, db
}

// startKeepingSingleTable creates the partitions, then starts the layout,
// so that the single table, empty, is still probed (Check would retire
// and drop it): the clean-up leaves it alone before the start.
func startKeepingSingleTable(t testing.TB, s *pgstore.Store, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "SELECT "+db.Table("exactly_keys2_start")+"()"); err != nil {
		t.Fatal(err)
	}
}

type bytesReader []byte

func (b bytesReader) Read(p []byte) (int, error) { return copy(p, b), nil }

// The conformance suite on the partitioned layout, with the suite's own IDs
// (text: the partition retired by DELETE), once with the legacy table
// retired by Check and once with it still probed. Time partitions keep their expired keys until the
// whole partition goes (TestPartitionRetirement), which the suite's
// Cleanup test does not expect; their claims are exercised below.
func TestConformancePartitioned(t *testing.T) {
	harness := func(t *testing.T, probed bool) dedupetest.Harness[pgx.Tx] {
		s, legacy, db := newPartitioned(t, &pgstore.Config{MaxResultBytes: 4096}, "")
		ctx := context.Background()
		_ = legacy
		if probed {
			// Check would retire (and drop) the empty legacy table.
			startKeepingSingleTable(t, s, db)
		} else if err := s.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if probed {
			var err error
			if s, err = pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned, MaxResultBytes: 4096}); err != nil {
				t.Fatal(err)
			}
		}
		var legacyProbed *string
		if err := db.Pool.QueryRow(ctx, "SELECT legacy FROM "+db.Table("exactly_keys2_state")).Scan(&legacyProbed); err != nil {
			t.Fatal(err)
		}
		if (legacyProbed != nil) != probed {
			t.Fatalf("legacy table probed: %v", legacyProbed)
		}
		return dedupetest.Harness[pgx.Tx]{
			Store:          s,
			Begin:          func(ctx context.Context) (pgx.Tx, error) { return db.Pool.Begin(ctx) },
			Commit:         func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback:       func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			Apply:          func(ctx context.Context, tx pgx.Tx, id string) error { return apply(ctx, db, tx, id) },
			Applied:        func(ctx context.Context, id string) (int, error) { return applied(ctx, db, id) },
			MaxResultBytes: 4096,
		}
	}
	t.Run("legacy-retired", func(t *testing.T) {
		dedupetest.Exercise(t, func(t *testing.T) dedupetest.Harness[pgx.Tx] { return harness(t, false) })
	})
	t.Run("legacy-probed", func(t *testing.T) {
		dedupetest.Exercise(t, func(t *testing.T) dedupetest.Harness[pgx.Tx] { return harness(t, true) })
	})
}

// writeLegacyKeys writes, with the legacy layout's store, the keys that an
// upgrade finds in the legacy table, and returns their IDs by name: done,
// text (not a UUID) and v7 (a UUIDv7) completed with result(name, id),
// leased under a lease of an hour, stale under a lease of 1ms, expired
// completed with a TTL of 1ms; payload(name) is each one's payload.
func writeLegacyKeys(t *testing.T, legacy *pgstore.Store, payload func(name string) string, result func(name, id string) string) map[string]string {
	t.Helper()
	ctx := context.Background()
	ids := map[string]string{"done": uuid.NewString(), "leased": uuid.NewString(), "stale": uuid.NewString(),
		"expired": uuid.NewString(), "text": "order-42", "v7": uuid.Must(uuid.NewV7()).String()}
	req := func(name string) dedupe.Request { return dedupetest.Req("s", ids[name], payload(name)) }
	for _, name := range []string{"done", "text", "v7"} {
		c, err := legacy.Do(ctx, req(name), func(context.Context, pgx.Tx) ([]byte, error) { return []byte(result(name, ids[name])), nil })
		if err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("legacy claim %s: %v %v", name, c.Decision, err)
		}
	}
	if _, err := legacy.Acquire(ctx, req("leased"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := legacy.Acquire(ctx, req("stale"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	short := req("expired")
	short.TTL = time.Millisecond
	if _, err := legacy.Do(ctx, short, noop); err != nil {
		t.Fatal(err)
	}
	return ids
}

// Keys written by today's code (the legacy layout) keep deduplicating on
// the partitioned layout until they expire, with nothing copied: completed
// ones are duplicates with their stored result, a valid lease is in
// flight, an expired lease is taken over and completed where it is, an
// expired key is claimed again. Once none is live, the legacy table is no
// longer read.
func TestPartitionedUpgradeFromLegacy(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	ids := writeLegacyKeys(t, legacy, func(string) string { return "p" }, func(name, _ string) string { return "r-" + name })
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"done", "text", "v7"} {
		c, err := s.Do(ctx, dedupetest.Req("s", ids[name], "p"), func(context.Context, pgx.Tx) ([]byte, error) {
			t.Errorf("%s ran again", name)
			return nil, nil
		})
		if err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "r-"+name || c.Record.Key.ID != ids[name] {
			t.Fatalf("%s: %v %q %v", name, c.Decision, c.Record.Result, err)
		}
		if _, err := s.Do(ctx, dedupetest.Req("s", ids[name], "other payload"), noop); !errors.Is(err, dedupe.ErrKeyReused) {
			t.Fatalf("%s with another payload: %v", name, err)
		}
	}
	if _, err := s.Do(ctx, dedupetest.Req("s", ids["leased"], "p"), noop); !errors.Is(err, dedupe.ErrInFlight) {
		t.Fatalf("leased: %v", err)
	}
	taken, err := s.Acquire(ctx, dedupetest.Req("s", ids["stale"], "p"), time.Hour)
	if err != nil || taken.Decision != dedupe.DecisionTakeover || taken.Record.Attempts != 2 {
		t.Fatalf("stale lease: %+v %v", taken, err)
	}
	if err := s.Complete(ctx, taken, []byte("late")); err != nil {
		t.Fatal(err)
	}
	short := dedupetest.Req("s", ids["expired"], "p")
	short.TTL = time.Millisecond
	if c, err := s.Do(ctx, short, noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("expired: %v %v", c.Decision, err)
	}
	var inLegacy, inNew int
	if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Table("exactly_keys")+"), (SELECT count(*) FROM "+
		db.Table("exactly_keys2")+")").Scan(&inLegacy, &inNew); err != nil || inLegacy != 6 || inNew != 1 {
		t.Fatalf("legacy %d keys, partitioned %d (%v); want 6 and 1: nothing copied", inLegacy, inNew, err)
	}
	if rec, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: ids["stale"]}); err != nil || rec.Status != dedupe.StatusCompleted || string(rec.Result) != "late" {
		t.Fatalf("stale after completion: %+v %v", rec, err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Completed != 5 || st.Processing != 1 {
		t.Fatalf("stats %+v %v; want the 5 live completed keys and the lease", st, err)
	}
	// While a legacy key is live, the legacy table stays probed.
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	legacyName := func() *string {
		var l *string
		if err := db.Pool.QueryRow(ctx, "SELECT legacy FROM "+db.Table("exactly_keys2_state")).Scan(&l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	if legacyName() == nil {
		t.Fatal("the legacy table was retired with live keys")
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys")+" SET expires_at = now() - interval '1 second', locked_until = NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if l := legacyName(); l != nil {
		t.Fatalf("the legacy table %s is still probed with no live key", *l)
	}
	// Dropped at a later run, once no store reads it (at once here).
	pgstore.SetDropAfter(s, 0)
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var gone bool
	if err := db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", db.Table("exactly_keys")).Scan(&gone); err != nil || !gone {
		t.Fatalf("the single table is still there once retired (%v)", err)
	}
	// Its keys expired with it; the partitioned layout goes on.
	if c, err := s.Do(ctx, dedupetest.Req("s", ids["done"], "p"), noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("a key of the dropped table after its TTL: %v %v", c.Decision, err)
	}
	if c, err := s.Do(ctx, dedupetest.Req("s", ids["done"], "p"), noop); err != nil || c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("its copy: %v %v", c.Decision, err)
	}
}

// A clean-up of the partitioned layout run where the layout has not
// started (a maintenance process left on the default layout beside
// workers kept on the single table) leaves the single table alone, even
// with no live key: its stores may still be claiming there.
func TestSingleTableKeptUntilPartitionedStarts(t *testing.T) {
	t.Parallel()
	s, single, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	short := dedupetest.Req("s", uuid.NewString(), "p")
	short.TTL = time.Millisecond
	if c, err := single.Do(ctx, short, noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("single-table claim: %v %v", c.Decision, err)
	}
	time.Sleep(10 * time.Millisecond)
	for range 2 {
		if _, err := s.Cleanup(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	var probed bool
	if err := db.Pool.QueryRow(ctx, "SELECT legacy IS NOT NULL AND to_regclass($1) IS NOT NULL FROM "+db.Table("exactly_keys2_state"),
		db.Table("exactly_keys")).Scan(&probed); err != nil || !probed {
		t.Fatalf("the single table was retired before the partitioned layout started (%v)", err)
	}
	if c, err := single.Do(ctx, dedupetest.Req("s", uuid.NewString(), "p"), noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("the single table's store after the clean-up: %v %v", c.Decision, err)
	}
}

// A time partition is dropped once its range is past and every key in it
// expired, never while a key in it is live; a later copy of a key from a
// dropped range is claimed in the other partition. Partitions are 2 s wide.
func TestPartitionRetirement(t *testing.T) {
	t.Parallel()
	s, _, db := newPartitioned(t, &pgstore.Config{PartitionsAhead: 2}, "2 seconds")
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	parts := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass", db.Table("exactly_keys2")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	first := parts()
	short := dedupetest.Req("s", uuid.Must(uuid.NewV7()).String(), "p")
	short.TTL = time.Second
	live := dedupetest.Req("s", uuid.Must(uuid.NewV7()).String(), "p")
	for _, r := range []dedupe.Request{short, live} {
		if c, err := s.Do(ctx, r, noop); err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("claim: %v %v", c.Decision, err)
		}
	}
	var inTime int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_keys2")+" WHERE kid < '10000000-0000-0000-0000-000000000000'").Scan(&inTime); err != nil || inTime != 2 {
		t.Fatalf("%d keys in time partitions (%v), want 2", inTime, err)
	}
	// The live key holds its partition: maintenance creates new ones ahead
	// and drops none of those its keys are in.
	deadline := time.Now().Add(5 * time.Second)
	testenv.WaitFor(t, 10*time.Second, "time to pass the keys' partition", func() bool { return time.Now().After(deadline) })
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, live.Key); err != nil {
		t.Fatalf("a live key went with its partition: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys2")+" SET expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Cleanup(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, live.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("expired key after its partition was retired: %v (cleanup said %d)", err, n)
	}
	var dead int64
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_keys2")).Scan(&dead); err != nil || dead != 0 {
		t.Fatalf("%d keys left (%v)", dead, err)
	}
	if got := parts(); got < first {
		t.Fatalf("%d partitions, fewer than the %d first created: none created ahead", got, first)
	}
	// A copy of the retired key goes to the other partition.
	c, err := s.Do(ctx, live, noop)
	if err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("a copy after retirement: %v %v", c.Decision, err)
	}
	var other int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_keys2_other")).Scan(&other); err != nil || other != 1 {
		t.Fatalf("%d keys in the other partition (%v), want 1", other, err)
	}
	if c, err := s.Do(ctx, live, noop); err != nil || c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("a second copy after retirement: %v %v", c.Decision, err)
	}
}

// Copies of one key claimed concurrently while maintenance retires the
// key's partition: every key is applied exactly once, whichever side of
// the boundary each copy lands on (its time partition, which then holds
// the partition back, or the other partition once the partition is gone).
// Partitions are 1 s wide; each round mints keys in the partition that has
// just passed and claims them from a store whose view of the partitions
// may be stale while another store's maintenance retires them: at once
// (even rounds: the claims race the retirement), or once the partition is
// gone (odd rounds: the claims race the stale view).
func TestPartitionBoundaryRace(t *testing.T) {
	t.Parallel()
	s, _, db := newPartitioned(t, &pgstore.Config{PartitionsAhead: 2}, "1 second")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	claimer, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const rounds, keys, copies = 12, 20, 4
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = s.Cleanup(ctx, nil)
		}
	}()
	errs := make(chan error, 3*rounds*keys*copies)
	var inOther, inTime int
	// More rounds, up to three times as many, until the keys have landed
	// on both sides of a boundary: which side a round's claims reach
	// depends on how fast the retirement runs.
	// The claims of even rounds start near the boundary: lead before it,
	// at it, or a few milliseconds after it, when the retirement of the
	// (empty) partition races them. On a loaded machine they may all start
	// late, so while no key has landed in its time partition the lead
	// doubles in the extra rounds.
	r, lead := 0, 30*time.Millisecond
	for ; r < rounds || (r < 3*rounds && (inOther == 0 || inTime == 0)); r++ {
		start := [...]time.Duration{-lead, 0, 3 * time.Millisecond, 10 * time.Millisecond}[r/2%4]
		if r >= rounds && inTime == 0 {
			lead = min(2*lead, 600*time.Millisecond)
			start = -lead
		}
		// Mint in the partition that ends at the next boundary, and claim
		// as it ends (even rounds) or once it is gone (odd rounds). A sleep,
		// not a poll: a poll's back-off would wake past the boundary.
		next := time.Now().Truncate(time.Second).Add(2 * time.Second)
		time.Sleep(time.Until(next.Add(start)))
		if r%2 == 1 {
			// Claimed once the partition is gone, by a store that may still
			// route them to it.
			testenv.WaitFor(t, 30*time.Second, "the partition to be retired", func() bool {
				var low time.Time
				err := db.Pool.QueryRow(ctx, "SELECT low FROM "+db.Table("exactly_keys2_state")).Scan(&low)
				return err == nil && !low.Before(next)
			})
		}
		var roundStart time.Time
		if err := db.Pool.QueryRow(ctx, "SELECT now()").Scan(&roundStart); err != nil {
			t.Fatal(err)
		}
		var kg sync.WaitGroup
		for k := 0; k < keys; k++ {
			id := v7At(next.Add(-time.Duration(k+1) * 10 * time.Millisecond))
			for c := 0; c < copies; c++ {
				kg.Add(1)
				go func() {
					defer kg.Done()
					// Live for the round (every copy is claimed within
					// it), expired soon after, so that the partitions go.
					req := dedupetest.Req("s", id, "p")
					req.TTL = 2 * time.Second
					fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return nil, apply(ctx, db, tx, id) }
					_, err := claimer.Do(ctx, req, fn)
					for errors.Is(err, dedupe.ErrInFlight) || isRetryable(err) {
						_, err = claimer.Do(ctx, req, fn)
					}
					if err != nil {
						errs <- fmt.Errorf("%s: %w", id, err)
					}
				}()
			}
		}
		kg.Wait()
		// Where this round's keys landed, before they expire.
		var o, tp int
		if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Table("exactly_keys2_other")+" WHERE created_at >= $1), (SELECT count(*) FROM "+
			db.Table("exactly_keys2")+" WHERE kid < '10000000-0000-0000-0000-000000000000' AND created_at >= $1)", roundStart).Scan(&o, &tp); err != nil {
			t.Fatal(err)
		}
		inOther, inTime = inOther+o, inTime+tp
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var doubled, total int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE n > 1), count(*) FROM "+db.Table("applied")).Scan(&doubled, &total); err != nil {
		t.Fatal(err)
	}
	if doubled != 0 || total != r*keys {
		t.Fatalf("%d of %d keys applied more than once; want 0 of %d", doubled, total, r*keys)
	}
	t.Logf("%d rounds (last lead %v): %d keys in their time partition, %d in the other partition", r, lead, inTime, inOther)
	if inOther == 0 || inTime == 0 {
		t.Fatalf("%d keys in time partitions, %d in the other partition: the race never crossed a boundary", inTime, inOther)
	}
}

// v7At is a UUIDv7 minted at t.
func v7At(t time.Time) string {
	u := uuid.New()
	ms := uint64(t.UnixMilli())
	for i := 5; i >= 0; i-- {
		u[i] = byte(ms)
		ms >>= 8
	}
	u[6] = u[6]&0x0f | 0x70
	return u.String()
}

func noop(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }

func sha256Of(s string) []byte { b := sha256.Sum256([]byte(s)); return b[:] }

func isRetryable(err error) bool {
	var r *dedupe.RetryableError
	return errors.As(err, &r)
}

// A read of a key whose scope a transaction still running is the first to
// claim answers "not found" at once: it adds no name, so it does not wait
// for that transaction (a duplicate HTTP request answered 409, not held).
func TestGetOfScopeBeingAdded(t *testing.T) {
	t.Parallel()
	s, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	req := dedupetest.Req("new-scope", uuid.Must(uuid.NewV7()).String(), "p")
	if c, err := s.ClaimTx(ctx, first, req); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("claim: %v %v", c.Decision, err)
	}
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	other, err := db.Pool.Begin(wait)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := s.GetTx(wait, other, req.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("get in another transaction: %v, want ErrNotFound at once", err)
	}
	if _, err := s.Get(wait, req.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("get on the pool: %v, want ErrNotFound at once", err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, req.Key); err != nil || rec.Status != dedupe.StatusCompleted {
		t.Fatalf("after the first commits: %+v %v", rec, err)
	}
}

// A single-table key leased past its TTL is live for claims (its lease
// holder may still complete it), so the clean-up keeps the table read.
func TestSingleTableKeptWhileALeaseLives(t *testing.T) {
	t.Parallel()
	s, single, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	req := dedupetest.Req("s", uuid.NewString(), "p")
	req.TTL = time.Millisecond
	if c, err := single.Acquire(ctx, req, time.Hour); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("lease: %v %v", c.Decision, err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := s.Check(ctx); err != nil { // starts the layout, runs the clean-up
		t.Fatal(err)
	}
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var probed bool
	if err := db.Pool.QueryRow(ctx, "SELECT legacy IS NOT NULL FROM "+db.Table("exactly_keys2_state")).Scan(&probed); err != nil || !probed {
		t.Fatalf("the single table was retired under a live lease (%v)", err)
	}
	if _, err := s.Do(ctx, req, noop); !errors.Is(err, dedupe.ErrInFlight) {
		t.Fatalf("a copy during the lease: %v, want ErrInFlight", err)
	}
}

// A scope whose keys are all in the single table (no partitioned claim of
// it yet) is read there.
func TestGetOfScopeInSingleTableOnly(t *testing.T) {
	t.Parallel()
	s, single, _ := newPartitioned(t, nil, "")
	ctx := context.Background()
	req := dedupetest.Req("old-scope", uuid.NewString(), "p")
	if _, err := single.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return []byte("r"), nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, req.Key)
	if err != nil || rec.Status != dedupe.StatusCompleted || string(rec.Result) != "r" {
		t.Fatalf("get: %+v %v, want the single table's completed key", rec, err)
	}
}

// A single table that cannot be dropped (a view of the user's depends on
// it) stays, retired, and the clean-up goes on without an error.
func TestSingleTableDropFailureLeavesCleanupRunning(t *testing.T) {
	t.Parallel()
	s, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE VIEW "+db.Table("keys_report")+" AS SELECT scope, key FROM "+db.Table("exactly_keys")); err != nil {
		t.Fatal(err)
	}
	pgstore.SetDropAfter(s, 0)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.Cleanup(ctx, nil); err != nil {
			t.Fatalf("clean-up: %v", err)
		}
	}
	var probed, there bool
	if err := db.Pool.QueryRow(ctx, "SELECT legacy IS NOT NULL, to_regclass($1) IS NOT NULL FROM "+db.Table("exactly_keys2_state"),
		db.Table("exactly_keys")).Scan(&probed, &there); err != nil || probed || !there {
		t.Fatalf("still read %v, still there %v (%v); want retired and kept", probed, there, err)
	}
}

// A partition's ATTACH waits for its lock at most 20 ms, so that no claim
// queues behind it; a lock on the key table that is busy for longer than
// that (another session's DDL, a LOCK TABLE) delays the maintenance, and
// does not fail it.
func TestPartitionAttachWaitsOutABusyLock(t *testing.T) {
	t.Parallel()
	s, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	locker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback(ctx) }()
	if _, err := locker.Exec(ctx, "LOCK TABLE "+db.Table("exactly_keys2")+" IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("cleanup with the key table's lock busy for 300ms: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass", db.Table("exactly_keys2")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no partition attached")
	}
	if c, err := s.Do(ctx, dedupetest.Req("s", "after-the-lock", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("a claim after the maintenance: %+v, %v", c, err)
	}
}

package pgstore_test

import (
	"context"
	"errors"
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

// Once a store of the partitioned layout has run on a schema, a store of
// the legacy layout there (an old worker left over from a rolling restart)
// claims no new key: every way in is refused with ErrSingleTableClosed, a
// configuration error, and nothing is applied or written, so a key the
// partitioned layout applied is never applied again by it. A lease the
// legacy store took before the switch is still completed where it is.
func TestLegacyClaimAfterPartitionedStartIsRefused(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	leased, err := legacy.Acquire(ctx, dedupetest.Req("s", uuid.NewString(), "p"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	apply := countRuns(db, "")
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	req := dedupetest.Req("s", uuid.NewString(), "p")
	if c, err := s.Do(ctx, req, apply); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("partitioned claim: %v %v", c.Decision, err)
	}

	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, pgstore.ErrSingleTableClosed) || !errors.Is(err, dedupe.ErrMisconfigured) {
			t.Errorf("%s on the legacy store: %v, want ErrSingleTableClosed", what, err)
		}
	}
	_, err = legacy.Do(ctx, req, apply)
	refused("Do", err)
	_, err = legacy.DoBatch(ctx, []dedupe.Request{req, dedupetest.Req("s", uuid.NewString(), "p")},
		func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
			_, err := apply(ctx, tx)
			return nil, err
		})
	refused("DoBatch", err)
	_, err = legacy.Acquire(ctx, dedupetest.Req("s", uuid.NewString(), "p"), time.Hour)
	refused("Acquire", err)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = legacy.ClaimTx(ctx, tx, dedupetest.Req("s", uuid.NewString(), "p"))
	refused("ClaimTx", err)
	_ = tx.Rollback(ctx)
	refused("Check", legacy.Check(ctx))

	var legacyKeys int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_keys")).Scan(&legacyKeys); err != nil {
		t.Fatal(err)
	}
	if n := runs(t, db); n != 1 {
		t.Fatalf("the key was applied %d times, want 1", n)
	}
	if legacyKeys != 1 {
		t.Fatalf("%d keys in exactly_keys, want 1 (the lease taken before the switch)", legacyKeys)
	}
	if err := legacy.Complete(ctx, leased, []byte("done")); err != nil {
		t.Fatalf("completing a lease taken before the switch: %v", err)
	}
	if c, err := s.Do(ctx, dedupetest.Req("s", leased.Record.Key.ID, "p"), apply); err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "done" {
		t.Fatalf("the completed legacy lease on the partitioned store: %v %q %v", c.Decision, c.Record.Result, err)
	}
}

// The partitioned layout's start waits for a legacy claim in flight (its
// key inserted, its transaction not yet committed), so the partitioned
// store's claim of the same key finds it once it commits: the key is
// applied once, by the legacy store.
func TestPartitionedStartWaitsForLegacyClaimInFlight(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	apply := countRuns(db, "first")
	req := dedupetest.Req("s", uuid.NewString(), "p")
	inside, release := make(chan struct{}), make(chan struct{})
	legacyDone := make(chan error, 1)
	go func() {
		_, err := legacy.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			close(inside)
			<-release
			return apply(ctx, tx)
		})
		legacyDone <- err
	}()
	<-inside
	type answer struct {
		c   dedupe.Claim
		err error
	}
	partDone := make(chan answer, 1)
	go func() {
		// A new worker starts: Check creates the partitions and starts
		// the layout, then it claims.
		if err := s.Check(ctx); err != nil {
			partDone <- answer{err: err}
			return
		}
		c, err := s.Do(ctx, req, apply)
		partDone <- answer{c, err}
	}()
	testenv.WaitFor(t, 30*time.Second, "the start waiting for the legacy claim, or the claim's answer", func() bool {
		if len(partDone) > 0 {
			return true
		}
		var waiting int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
			db.Schema+`"."exactly_keys2_start"()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
	select {
	case a := <-partDone:
		close(release)
		<-legacyDone
		t.Fatalf("the partitioned claim answered (%v, %v) while a legacy claim of its key was in flight: applied %d times",
			a.c.Decision, a.err, runs(t, db))
	default:
	}
	close(release)
	if err := <-legacyDone; err != nil {
		t.Fatal(err)
	}
	a := <-partDone
	if a.err != nil || a.c.Decision != dedupe.DecisionDuplicate || string(a.c.Record.Result) != "first" {
		t.Fatalf("the partitioned claim after the legacy one: %v %q %v, want a duplicate with its result", a.c.Decision, a.c.Record.Result, a.err)
	}
	if n := runs(t, db); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
}

// countRuns returns a function for Do that records each of its runs as a
// row of the applied table and returns result; runs counts them.
func countRuns(db *pgtest.DB, result string) pgstore.TxFunc {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+db.Table("applied")+" VALUES (gen_random_uuid()::text, 1)")
		return []byte(result), err
	}
}

// runs counts the runs that countRuns recorded and that committed.
func runs(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Table("applied")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

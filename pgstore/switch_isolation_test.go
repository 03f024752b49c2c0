package pgstore_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// A legacy claim in a REPEATABLE READ transaction whose snapshot predates
// the partitioned layout's start is refused too: the guard is a trigger the
// start enabled, which no snapshot hides, so the legacy store never claims
// a key that the partitioned store has already claimed and applied.
func TestLegacyRepeatableReadClaimAfterStart(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	apply := countRuns(db, "")
	// The legacy store's transaction, its snapshot taken.
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+db.Table("applied")+" LIMIT 1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	req := dedupetest.Req("s", uuid.NewString(), "p")
	// The partitioned store starts its layout (Check) and applies the key.
	if c, err := s.Do(ctx, req, apply); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("partitioned claim: %v %v", c.Decision, err)
	}
	c, err := legacy.ClaimTx(ctx, tx, req)
	if err == nil && c.Decision == dedupe.DecisionNew {
		if _, err := apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("legacy claim: %v %v", c.Decision, err)
	if n := runs(t, db); n != 1 {
		t.Fatalf("the key was applied %d times, want 1 (legacy claim: %v %v)", n, c.Decision, err)
	}
}

// A partitioned claim in a caller's REPEATABLE READ transaction whose
// snapshot predates a legacy store's claim of the same key, on a layout not
// started yet: the layout is never started in a caller's transaction (its
// probe of exactly_keys would read the old snapshot and miss the key), so
// the claim is refused with the fix (Store.Check at start-up) and the key
// is applied once.
func TestPartitionedRepeatableReadClaimMissesLegacyKey(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	apply := countRuns(db, "")
	// Partitions exist, the layout not started yet (as before the
	// first partitioned worker's claim).
	if _, err := s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys2_state")+" SET started_at = NULL; "+
		"ALTER TABLE "+db.Table("exactly_keys")+" DISABLE TRIGGER exactly_keys_legacy_guard"); err != nil {
		t.Fatal(err)
	}
	s2, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+db.Table("applied")+" LIMIT 1"); err != nil {
		t.Fatal(err)
	}
	req := dedupetest.Req("s", uuid.NewString(), "p")
	if c, err := legacy.Do(ctx, req, apply); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("legacy claim: %v %v", c.Decision, err)
	}
	c, err := s2.ClaimTx(ctx, tx, req)
	t.Logf("partitioned claim: %v %v", c.Decision, err)
	if err == nil && c.Decision == dedupe.DecisionNew {
		if _, err := apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs(t, db); n != 1 {
		t.Fatalf("the key was applied %d times, want 1", n)
	}
}

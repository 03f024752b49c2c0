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
	"github.com/exactly-go/exactly/pgstore"
)

// A transaction that began while a single-table key was live, and takes
// that key over once the clean-up has retired the table, must not write
// it there: no store reads the single table any more, so a copy claimed
// after it would be applied again. The takeover is refused (a retryable
// error) and the copy is applied once, at every isolation level (the
// table's update guard, not the state the transaction's snapshot shows,
// refuses it).
func TestSingleTableTakeoverAfterRetire(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			takeoverAfterRetire(t, iso)
		})
	}
}

// takeoverAfterRetire runs TestSingleTableTakeoverAfterRetire with the
// caller's transaction at iso, its snapshot taken before the retire.
func takeoverAfterRetire(t *testing.T, iso pgx.TxIsoLevel) {
	s, single, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	// A lease that its holder lost (it expires at once), on a key whose TTL
	// ends soon.
	req := dedupetest.Req("s", uuid.NewString(), "p")
	req.TTL = 1500 * time.Millisecond
	if c, err := single.Acquire(ctx, req, time.Millisecond); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("lease: %v %v", c.Decision, err)
	}
	if err := s.Check(ctx); err != nil { // starts the layout; the key is live, so the table is kept
		t.Fatal(err)
	}
	// Another process's store, whose state (read now) names the single table.
	other, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Do(ctx, dedupetest.Req("s", uuid.NewString(), "p"), noop); err != nil {
		t.Fatal(err)
	}
	// Its transaction begins while the key is live.
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)                              //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // its snapshot, at REPEATABLE READ and above
		t.Fatal(err)
	}
	time.Sleep(req.TTL + 200*time.Millisecond)
	retireSingleTable(t, s, db)
	applied := 0
	c, err := other.ClaimTx(ctx, tx, req)
	if err == nil && c.Decision != dedupe.DecisionDuplicate {
		if err := other.CompleteTx(ctx, tx, c, nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		applied++
	} else if err != nil && !dedupe.IsRetryable(err) {
		t.Fatalf("the takeover after the retire: %v, want a retryable error", err)
	}
	// A copy, on a store that read the state after the retire.
	if c, err := s.Do(ctx, req, noop); err != nil {
		t.Fatal(err)
	} else if c.Decision != dedupe.DecisionDuplicate {
		applied++
	}
	if applied != 1 {
		t.Fatalf("the key was applied %d times, want once", applied)
	}
}

// A lease holder that completes its single-table key after the clean-up
// retired the table (its lease and the key's TTL passed meanwhile) is told
// that it lost the lease: its completion would land in a table no store
// reads, and a copy claimed after it would run as if the key were new.
func TestSingleTableCompleteAfterRetire(t *testing.T) {
	t.Parallel()
	s, single, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	req := dedupetest.Req("s", uuid.NewString(), "p")
	req.TTL = time.Hour
	if _, err := single.Acquire(ctx, req, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	// A store of the partitioned layout takes the lost lease over where it
	// is, in the single table, for a short lease and TTL.
	other, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	req.TTL = 500 * time.Millisecond
	c, err := other.Acquire(ctx, req, 100*time.Millisecond)
	if err != nil || c.Decision != dedupe.DecisionTakeover {
		t.Fatalf("takeover: %v %v", c.Decision, err)
	}
	time.Sleep(req.TTL + 200*time.Millisecond)
	retireSingleTable(t, s, db)
	if err := other.Complete(ctx, c, nil); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("a completion after the retire: %v, want ErrLeaseLost", err)
	}
}

// A store of the single-table layout (a worker of an older version, during
// a rolling upgrade) whose lease expired with its key's TTL, and completes
// after the clean-up retired the table, is told that it lost the lease: its
// completion is refused by the table's update guard.
func TestSingleTableStoreCompleteAfterRetire(t *testing.T) {
	t.Parallel()
	s, single, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	req := dedupetest.Req("s", uuid.NewString(), "p")
	req.TTL = 500 * time.Millisecond
	c, err := single.Acquire(ctx, req, 100*time.Millisecond)
	if err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("lease: %v %v", c.Decision, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(req.TTL + 200*time.Millisecond)
	retireSingleTable(t, s, db)
	if err := single.Complete(ctx, c, nil); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("a completion after the retire: %v, want ErrLeaseLost", err)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, "SELECT status FROM "+db.Table("exactly_keys")+" WHERE key = $1", req.Key.ID).Scan(&status); err != nil || status != "PROCESSING" {
		t.Fatalf("the retired table's row: %q %v, want it untouched", status, err)
	}
}

// retireSingleTable runs the clean-up, which must retire the single table.
func retireSingleTable(t *testing.T, s *pgstore.Store, db *pgtest.DB) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var probed bool
	if err := db.Pool.QueryRow(ctx, "SELECT legacy IS NOT NULL FROM "+db.Table("exactly_keys2_state")).Scan(&probed); err != nil || probed {
		t.Fatalf("the clean-up did not retire the single table (probed %v, %v)", probed, err)
	}
}

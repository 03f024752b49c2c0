package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// The retire's check reads what the writers it waited for committed, so it
// runs at READ COMMITTED whatever the session's default (a role whose
// default is REPEATABLE READ would take its snapshot before the wait), and
// the function refuses any other level. The single table has no update
// guard before the retire (a row trigger, even disabled, costs each update
// a row lock), and an enabled one after it.
func TestSingleTableRetireIsolationAndGuard(t *testing.T) {
	t.Parallel()
	_, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	guard := func() (exists, enabled bool) {
		t.Helper()
		err := db.Pool.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(tgenabled <> 'D'), false) FROM pg_trigger
WHERE tgrelid = $1::regclass AND tgname = 'exactly_keys_retired_guard'`, db.Table("exactly_keys")).Scan(&exists, &enabled)
		if err != nil {
			t.Fatal(err)
		}
		return exists, enabled
	}
	if exists, _ := guard(); exists {
		t.Fatal("the single table has its update guard before the retire")
	}
	// A store whose every transaction defaults to REPEATABLE READ.
	cfg := db.Pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	rr, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	tx, err := rr.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "SELECT "+db.Table("exactly_keys2_retire")+"()")
	_ = tx.Rollback(ctx)
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Fatalf("the retire in a REPEATABLE READ transaction: %v, want it refused", err)
	}
	s, err := pgstore.New(rr, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil { // starts the layout and runs the clean-up, which retires the empty table
		t.Fatal(err)
	}
	var probed bool
	if err := db.Pool.QueryRow(ctx, "SELECT legacy IS NOT NULL FROM "+db.Table("exactly_keys2_state")).Scan(&probed); err != nil || probed {
		t.Fatalf("a store on REPEATABLE READ sessions did not retire the single table (probed %v, %v)", probed, err)
	}
	if exists, enabled := guard(); !exists || !enabled {
		t.Fatalf("after the retire the update guard exists %v, enabled %v", exists, enabled)
	}
}

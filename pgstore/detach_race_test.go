package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// A claim that names its key's time partition, routed there by a state
// read before the partition was retired, neither loses nor doubles the key
// when the retirement's DETACH (then DROP) gets there first: the claim
// waits for the retirement's lock (waits), or comes once the partition is
// detached and not dropped yet (detached); either way its key must not go
// into the detached table, which is dropped with it, but be claimed again
// (in the other partition), and a copy claimed afterwards is a duplicate,
// applied once. The retirement is done by hand, as retirePartition does
// it, on the partition that the state reads as the oldest, in every exec
// mode that plans a statement differently (a statement prepared once, one
// planned at each execution, the simple protocol), by Do and by DoBatch.
func TestClaimRacingPartitionDetach(t *testing.T) {
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, mode := range modes {
		for _, when := range []string{"waits", "detached"} {
			for _, batch := range []bool{false, true} {
				t.Run(fmt.Sprint(mode, "/", when, "/batch=", batch), func(t *testing.T) {
					t.Parallel()
					claimRacingDetach(t, mode, when == "waits", batch)
				})
			}
		}
	}
}

func claimRacingDetach(t *testing.T, mode pgx.QueryExecMode, waits, batch bool) {
	_, _, db := newPartitioned(t, nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgtest.Config(pgtest.RequireURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// One connection: the warm-up prepares the claim on the connection
	// that then claims the racing key.
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	state := db.Table("exactly_keys2_state")
	var low time.Time
	var width time.Duration
	if err := db.Pool.QueryRow(ctx, "SELECT low, width FROM "+state).Scan(&low, &width); err != nil {
		t.Fatal(err)
	}
	name := "exactly_keys2_p" + strconv.FormatInt(low.Unix(), 10)
	part := db.Table(name)
	// Both keys in the oldest partition; the first one read the state and
	// prepared the claim on the store's connection.
	warm, racer := v7At(low.Add(time.Millisecond)), v7At(low.Add(2*time.Millisecond))
	do := func(id string) (dedupe.Claim, error) {
		req := dedupetest.Req("s", id, "p")
		if !batch {
			return s.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return nil, apply(ctx, db, tx, id) })
		}
		out, err := s.DoBatch(ctx, []dedupe.Request{req}, func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
			for range fresh {
				if err := apply(ctx, db, tx, id); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
		if err != nil {
			return dedupe.Claim{}, err
		}
		return out[0].Claim, out[0].Err
	}
	claim := func(id string) (dedupe.Claim, error) {
		for {
			c, err := do(id)
			var r *dedupe.RetryableError
			if !errors.As(err, &r) || ctx.Err() != nil {
				return c, err
			}
		}
	}
	if c, err := claim(warm); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("claim %s: %v %v", warm, c.Decision, err)
	}
	var where string
	if err := db.Pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM "+db.Table("exactly_keys2")+" WHERE kid = $1::uuid", warm).Scan(&where); err != nil {
		t.Fatal(err)
	}
	if where != db.Schema+"."+name {
		t.Fatalf("the first key is in %s, want %s", where, part)
	}
	if _, err := db.Pool.Exec(ctx, "DELETE FROM "+part); err != nil {
		t.Fatal(err)
	}

	// The retirement: lock the partition against inserts, move the low
	// bound past it, detach it; commit; drop it.
	retire, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = retire.Rollback(context.Background()) }()
	for _, stmt := range []string{
		"LOCK TABLE " + part + " IN SHARE MODE",
		"UPDATE " + state + " SET low = low + width",
		"ALTER TABLE " + db.Table("exactly_keys2") + " DETACH PARTITION " + part,
	} {
		if _, err := retire.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	type result struct {
		c   dedupe.Claim
		err error
	}
	done := make(chan result, 1)
	if waits {
		go func() {
			c, err := claim(racer)
			done <- result{c, err}
		}()
		// A claim that names the partition waits for its lock; one through
		// the partitioned table (a batch), for the table's.
		testenv.WaitFor(t, 20*time.Second, "the claim to wait for the retirement's lock", func() bool {
			var n int
			err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation IN ($1::regclass, $2::regclass)",
				part, db.Table("exactly_keys2")).Scan(&n)
			return err == nil && n > 0
		})
	}
	if err := retire.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !waits {
		c, err := claim(racer)
		done <- result{c, err}
	}
	r := <-done
	if r.err != nil || r.c.Decision != dedupe.DecisionNew {
		t.Fatalf("the racing claim: %v %v", r.c.Decision, r.err)
	}
	var inDetached int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+part).Scan(&inDetached); err != nil || inDetached != 0 {
		t.Fatalf("%d keys in the detached partition (%v): the claim wrote to a table that is no longer a partition", inDetached, err)
	}
	if _, err := db.Pool.Exec(ctx, "DROP TABLE "+part); err != nil {
		t.Fatal(err)
	}
	if c, err := claim(racer); err != nil || c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("a copy of the racing key after the drop: %v %v, want a duplicate", c.Decision, err)
	}
	if n, err := applied(ctx, db, racer); err != nil || n != 1 {
		t.Fatalf("the racing key applied %d times (%v), want 1", n, err)
	}
}

package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// A store with the zero Config keeps its keys in the partitioned layout,
// and claims without Check: its first claim on the pool creates the first
// partitions (a time-ordered key then lands in its day partition, and no
// key goes to the single table). A role that may not create them gets a
// configuration error saying so, not a claim.
func TestDefaultLayoutIsPartitioned(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	s, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Config().Layout; got != pgstore.LayoutPartitioned {
		t.Fatalf("default layout %v, want partitioned", got)
	}
	rows := db.RowsOnlyPool(t)
	plain, err := pgstore.New(rows, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Do(ctx, dedupetest.Req("s", uuid.Must(uuid.NewV7()).String(), "p"), noop); !errors.Is(err, dedupe.ErrMisconfigured) {
		t.Fatalf("a claim by a role that may not create the partitions: %v, want a configuration error", err)
	}
	v7 := uuid.Must(uuid.NewV7()).String()
	for _, do := range []func() (dedupe.Decision, error){
		func() (dedupe.Decision, error) {
			c, err := s.Do(ctx, dedupetest.Req("s", v7, "p"), func(context.Context, pgx.Tx) ([]byte, error) { return []byte("r"), nil })
			return c.Decision, err
		},
		func() (dedupe.Decision, error) {
			out, err := s.DoBatch(ctx, reqsOf("s", uuid.Must(uuid.NewV7()).String(), uuid.NewString()), func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil })
			if err != nil {
				return 0, err
			}
			return out[0].Decision, out[0].Err
		},
	} {
		if _, err := do(); err != nil {
			t.Fatalf("a claim without Check: %v", err)
		}
	}
	// The first clean-up retired the empty single table, as on every new
	// deployment (a later one drops it).
	var single, timed int
	var probed bool
	if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Table("exactly_keys")+"), (SELECT count(*) FROM "+
		db.Table("exactly_keys2")+" WHERE kind = '7'), (SELECT legacy IS NOT NULL FROM "+db.Table("exactly_keys2_state")+")").
		Scan(&single, &timed, &probed); err != nil {
		t.Fatal(err)
	}
	if single != 0 || timed != 2 || probed {
		t.Fatalf("%d keys in the single table (still read: %v), %d UUIDv7 keys in the partitioned one; want 0, retired, and 2", single, probed, timed)
	}
	if rec, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: v7}); err != nil || string(rec.Result) != "r" {
		t.Fatalf("the key: %+v %v", rec, err)
	}
	// The partitions exist now: the role without DDL claims.
	if c, err := plain.Do(ctx, dedupetest.Req("s", uuid.Must(uuid.NewV7()).String(), "p"), noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("a claim by the role without DDL once the partitions exist: %v %v", c.Decision, err)
	}
}

package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// ulidOf is the ULID with the bytes of the UUID id: stored with the same
// 16 bytes as id, told apart by its kind.
func ulidOf(t *testing.T, id string) string {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	return dedupe.TimeID{Kind: dedupe.ULID, Bytes: u}.String()
}

// Batches on the partitioned layout over every kind of ID at once (UUIDv7s
// and ULIDs with the same bytes, in their time partitions; random UUIDs,
// text and UUIDv7s older than the partitions, in the other partition),
// overlapping and in different orders: every key is applied once, no batch
// fails, and an ID minted beyond the partitions created ahead is an invalid
// key of its own that does not fail the batch.
func TestDoBatchPartitionedKinds(t *testing.T) {
	t.Parallel()
	s, db := storeMakers[pgstore.LayoutPartitioned](t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var all []dedupe.Request
	add := func(id string) { all = append(all, dedupetest.Req("s", id, "payload of "+id)) }
	for i := range 40 {
		v7 := uuid.Must(uuid.NewV7()).String()
		add(v7)
		if i%2 == 0 {
			add(ulidOf(t, v7))
		}
		add(uuid.NewString())
		if i%4 == 0 {
			add(fmt.Sprintf("order-%d", i))
			add(v7At(time.Now().Add(-30 * 24 * time.Hour)))
		}
	}
	future := dedupetest.Req("s", v7At(time.Now().Add(30*24*time.Hour)), "from a clock ahead")
	const workers, rounds = 6, 8
	var wg sync.WaitGroup
	var fresh, dups atomic.Int64
	errs := make(chan error, workers*rounds*len(all))
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			for range rounds {
				batch := slices.Clone(all)
				rnd.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				batch = append(batch[:len(batch)*2/3], future)
				out, err := s.DoBatch(ctx, batch, applyBatch(db, batch, nil))
				if err != nil {
					errs <- err
					return
				}
				for i, c := range out {
					switch {
					case batch[i].Key == future.Key:
						if !errors.Is(c.Err, dedupe.ErrInvalidKey) {
							errs <- fmt.Errorf("the ID minted ahead: %+v, want an invalid key", c)
						}
					case c.Err != nil:
						errs <- c.Err
					case c.Decision == dedupe.DecisionNew:
						fresh.Add(1)
						if c.Record.Key != batch[i].Key || string(c.Record.Result) != "r:"+batch[i].Key.ID {
							errs <- fmt.Errorf("claim %d of %s answered %s with %q", i, batch[i].Key, c.Record.Key, c.Record.Result)
						}
					case c.Decision == dedupe.DecisionDuplicate:
						dups.Add(1)
						if c.Record.Key != batch[i].Key || string(c.Record.Result) != "r:"+batch[i].Key.ID {
							errs <- fmt.Errorf("duplicate %s answered %s with %q", batch[i].Key, c.Record.Key, c.Record.Result)
						}
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
	if over != 0 || int64(total) != fresh.Load() || rows != len(all) {
		t.Fatalf("%d of %d ids applied %d times in all, %d of them more than once; batches reported %d new, %d duplicates",
			rows, len(all), total, over, fresh.Load(), dups.Load())
	}
	kinds := map[string]int{}
	rs, err := db.Pool.Query(ctx, "SELECT kind::text, tableoid::regclass::text = $1, count(*) FROM "+db.Table("exactly_keys2")+" GROUP BY 1, 2",
		db.Schema+".exactly_keys2_other")
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var kind string
		var other bool
		var n int
		if err := rs.Scan(&kind, &other, &n); err != nil {
			t.Fatal(err)
		}
		kinds[fmt.Sprintf("%s other=%v", kind, other)] = n
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"7 other=false": 40, "l other=false": 20, "u other=true": 40, "t other=true": 10, "o other=true": 10}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("stored keys by kind and partition %v, want %v", kinds, want)
	}
	// Every key again, in one batch: all duplicates, none applied again.
	out, err := s.DoBatch(ctx, all, func(context.Context, pgx.Tx, []int) ([][]byte, error) {
		return nil, errors.New("a duplicate ran")
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range out {
		if c.Err != nil || c.Decision != dedupe.DecisionDuplicate || c.Record.Key != all[i].Key {
			t.Fatalf("%s again: %+v", all[i].Key, c)
		}
	}
}

// A batch on the partitioned layout while the legacy table is probed: the
// keys written by the legacy code decide where they are (duplicates with
// their result, a lease in flight, an expired lease taken over, an expired
// key claimed anew), with nothing copied; the others are claimed in one
// statement.
func TestDoBatchPartitionedUpgradeFromLegacy(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	ids := writeLegacyKeys(t, legacy, func(name string) string { return "p " + name }, func(_, id string) string { return "r:" + id })
	time.Sleep(20 * time.Millisecond)
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	var reqs []dedupe.Request
	for _, name := range []string{"done", "leased", "stale", "expired", "text", "v7"} {
		reqs = append(reqs, dedupetest.Req("s", ids[name], "p "+name))
	}
	newV7, newV4 := uuid.Must(uuid.NewV7()).String(), uuid.NewString()
	reqs = append(reqs, dedupetest.Req("s", newV7, "p new v7"), dedupetest.Req("s", newV4, "p new v4"),
		dedupetest.Req("s", ids["done"], "another payload"))
	out, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"duplicate", "in flight", "takeover", "new", "duplicate", "duplicate", "new", "new", "reused"}
	for i, c := range out {
		got := c.Decision.String()
		switch {
		case errors.Is(c.Err, dedupe.ErrInFlight):
			got = "in flight"
		case errors.Is(c.Err, dedupe.ErrKeyReused):
			got = "reused"
		case c.Err != nil:
			got = c.Err.Error()
		}
		if got != want[i] {
			t.Errorf("%s: %s, want %s", reqs[i].Key, got, want[i])
		}
		if got == "duplicate" && string(c.Record.Result) != "r:"+reqs[i].Key.ID {
			t.Errorf("%s: result %q", reqs[i].Key, c.Record.Result)
		}
	}
	wantApplied(t, db, map[string]int{ids["stale"]: 1, ids["expired"]: 1, newV7: 1, newV4: 1, ids["done"]: 0, ids["v7"]: 0})
	var inLegacy, inNew int
	if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Table("exactly_keys")+"), (SELECT count(*) FROM "+
		db.Table("exactly_keys2")+")").Scan(&inLegacy, &inNew); err != nil || inLegacy != 6 || inNew != 3 {
		t.Fatalf("legacy %d keys, partitioned %d (%v); want 6 and 3: nothing copied", inLegacy, inNew, err)
	}
	if rec, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: ids["stale"]}); err != nil || rec.Status != dedupe.StatusCompleted ||
		rec.Attempts != 2 || string(rec.Result) != "r:"+ids["stale"] {
		t.Fatalf("the stale lease after the batch: %+v %v", rec, err)
	}
}

// A batch on a store whose state still names the legacy table after
// another store's clean-up retired and dropped it: the batch is retried
// with the state read again, and claims its keys.
func TestDoBatchAfterTheLegacyTableIsDropped(t *testing.T) {
	t.Parallel()
	s, legacy, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	if _, err := legacy.Do(ctx, dedupetest.Req("s", "old", "p"), noop); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	first := reqsOf("s", "old", uuid.NewString())
	if _, err := s.DoBatch(ctx, first, applyBatch(db, first, nil)); err != nil { // the state, legacy table named, is cached
		t.Fatal(err)
	}
	maint, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys")+" SET expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	pgstore.SetDropAfter(maint, 0)
	for range 2 { // retired, then dropped
		if _, err := maint.Cleanup(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	var gone bool
	if err := db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", db.Table("exactly_keys")).Scan(&gone); err != nil || !gone {
		t.Fatalf("the clean-up left the single table with no live key (%v)", err)
	}
	batch := reqsOf("s", uuid.NewString(), uuid.Must(uuid.NewV7()).String())
	out, err := s.DoBatch(ctx, batch, applyBatch(db, batch, nil))
	if err != nil {
		t.Fatalf("a batch after the legacy table was dropped: %v", err)
	}
	for i, c := range out {
		if c.Err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("%s: %+v", batch[i].Key, c)
		}
	}
	wantApplied(t, db, map[string]int{batch[0].Key.ID: 1, batch[1].Key.ID: 1})
}

package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// countedStore returns a store of layout on a fresh schema whose pool
// counts its statements, its partitions created.
func countedStore(t *testing.T, layout pgstore.Layout, cfg pgstore.Config) (*pgstore.Store, *countingTracer) {
	t.Helper()
	db := pgtest.New(t)
	pool, counter := tracedPool(t, 2)
	cfg.Schema, cfg.Layout, cfg.Logger = db.Schema, layout, slog.New(slog.DiscardHandler)
	s, err := pgstore.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, counter
}

// A batch of fresh keys with results costs the same number of statements
// whatever its size, on both layouts and for every kind of ID the
// partitioned layout stores (its time partitions, its other partition):
// BEGIN with the claim (and, on the partitioned layout, the read of the
// transaction's time), the results, COMMIT. Its duplicates carry the
// results afterwards, and a result over MaxResultBytes is refused.
func TestDoBatchResultsStatements(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, counter := countedStore(t, layout, pgstore.Config{MaxResultBytes: 64})
			batch := func(n int) []dedupe.Request {
				reqs := make([]dedupe.Request, 0, n)
				for i := range n {
					var id string
					switch i % 3 {
					case 0:
						id = uuid.Must(uuid.NewV7()).String()
					case 1:
						id = uuid.NewString()
					default:
						id = "order-" + uuid.NewString()
					}
					reqs = append(reqs, dedupetest.Req("s", id, "payload of "+id))
				}
				return reqs
			}
			result := func(r dedupe.Request) []byte { return []byte("r:" + r.Key.ID) }
			withResults := func(reqs []dedupe.Request) pgstore.BatchFunc {
				return func(_ context.Context, _ pgx.Tx, fresh []int) ([][]byte, error) {
					out := make([][]byte, len(fresh))
					for j, i := range fresh {
						out[j] = result(reqs[i])
					}
					return out, nil
				}
			}
			run := func(reqs []dedupe.Request) ([]pgstore.BatchClaim, int64) {
				t.Helper()
				before := counter.stmts.Load()
				out, err := s.DoBatch(ctx, reqs, withResults(reqs))
				if err != nil {
					t.Fatal(err)
				}
				return out, counter.stmts.Load() - before
			}
			run(batch(3)) // the scope's code, the layout's state, the statements prepared
			counts, afterStored := map[int]int64{}, map[int]int64{}
			for _, n := range []int{1, 2, 10, 40} {
				// A batch of new keys after the duplicates of the last
				// one goes to the statement that answers stored keys; the
				// next tries its keys as new first, as batches do until
				// one finds a stored key. Each path costs the same
				// whatever the size.
				_, afterStored[n] = run(batch(n))
				reqs := batch(n)
				out, stmts := run(reqs)
				for i, c := range out {
					if c.Err != nil || c.Decision != dedupe.DecisionNew {
						t.Fatalf("batch of %d, key %d: %v %v", n, i, c.Decision, c.Err)
					}
				}
				counts[n] = stmts
				dups, _ := run(reqs)
				for i, c := range dups {
					if c.Err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != string(result(reqs[i])) {
						t.Fatalf("batch of %d again, key %s: %v %q %v; want a duplicate with %q",
							n, reqs[i].Key, c.Decision, c.Record.Result, c.Err, result(reqs[i]))
					}
					if rec, err := s.Get(ctx, reqs[i].Key); err != nil || string(rec.Result) != string(result(reqs[i])) {
						t.Fatalf("stored %s: %q %v", reqs[i].Key, rec.Result, err)
					}
				}
			}
			if counts[1] != counts[40] || counts[2] != counts[40] || counts[10] != counts[40] {
				t.Fatalf("statements for a batch of fresh keys with results, by batch size: %v; want the same for every size", counts)
			}
			if afterStored[2] != afterStored[40] || afterStored[10] != afterStored[40] {
				t.Fatalf("statements for a batch of fresh keys with results after a batch of stored ones, by batch size: %v; "+
					"want the same for every size", afterStored)
			}
			t.Logf("statements for a batch of fresh keys with results, by batch size: %v", counts)

			reqs := batch(4)
			_, err := s.DoBatch(ctx, reqs, func(_ context.Context, _ pgx.Tx, fresh []int) ([][]byte, error) {
				out := make([][]byte, len(fresh))
				for j := range fresh {
					out[j] = []byte("ok")
				}
				out[len(out)-1] = []byte(strings.Repeat("x", 65))
				return out, nil
			})
			var tooLarge *dedupe.ResultTooLargeError
			if !errors.As(err, &tooLarge) {
				t.Fatalf("a batch with a result over MaxResultBytes: %v; want a ResultTooLargeError", err)
			}
			for _, r := range reqs {
				if _, err := s.Get(ctx, r.Key); !errors.Is(err, dedupe.ErrNotFound) {
					t.Fatalf("%s after the refused batch: %v; want it rolled back", r.Key, err)
				}
			}
		})
	}
}

// On the partitioned layout, a batch of new keys is one round trip before
// its function (BEGIN with the insert that answers a count) and the
// COMMIT. A batch that finds a stored key pays one more round trip (the
// insert's transaction rolled back, the batch claimed again by the
// statement that answers each key) and is answered the same; the batches
// after it go to that statement at once, until one of them inserts all
// its keys.
func TestDoBatchFoundStoredRoundTrips(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, counter := countedStore(t, pgstore.LayoutPartitioned, pgstore.Config{})
	batch := func(n int) []dedupe.Request {
		reqs := make([]dedupe.Request, n)
		for i := range reqs {
			id := uuid.Must(uuid.NewV7()).String()
			reqs[i] = dedupetest.Req("s", id, "payload of "+id)
		}
		return reqs
	}
	run := func(name string, reqs []dedupe.Request, want []dedupe.Decision, trips int64) {
		t.Helper()
		before := counter.n.Load()
		var ran []int
		out, err := s.DoBatch(ctx, reqs, func(_ context.Context, _ pgx.Tx, fresh []int) ([][]byte, error) {
			ran = fresh
			return nil, nil
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := counter.n.Load() - before
		for i, c := range out {
			if c.Err != nil || c.Decision != want[i] {
				t.Fatalf("%s, key %d: %v %v, want %v", name, i, c.Decision, c.Err, want[i])
			}
		}
		var fresh []int
		for i, d := range want {
			if d == dedupe.DecisionNew {
				fresh = append(fresh, i)
			}
		}
		if !slices.Equal(ran, fresh) {
			t.Fatalf("%s: the function ran for %v, want %v", name, ran, fresh)
		}
		if trips > 0 && got != trips {
			t.Fatalf("%s: %d round trips, want %d", name, got, trips)
		}
	}
	n, d := dedupe.DecisionNew, dedupe.DecisionDuplicate
	run("first batch", batch(3), []dedupe.Decision{n, n, n}, 0) // reads the scope's code and the layout's state
	a := batch(3)
	run("new keys", a, []dedupe.Decision{n, n, n}, 2)
	mixed := append(batch(1), a[1], a[2])
	run("a batch with stored keys", mixed, []dedupe.Decision{n, d, d}, 3)
	run("the same batch again", mixed, []dedupe.Decision{d, d, d}, 2)
	run("new keys after it", batch(2), []dedupe.Decision{n, n}, 2)
	run("new keys again", batch(2), []dedupe.Decision{n, n}, 2)
	run("duplicates again", a, []dedupe.Decision{d, d, d}, 3)
}

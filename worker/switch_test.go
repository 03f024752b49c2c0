package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

// A worker of the legacy key layout started after a worker of the
// partitioned layout ran on its schema (a rolling restart that brought an
// old configuration back) refuses to run, naming the fix, instead of
// claiming keys that the partitioned layout may have applied.
func TestLegacyWorkerRefusedAfterTheSwitch(t *testing.T) {
	w := newWorld(t, 1)
	part := w.config(func(c *worker.Config) { c.KeyLayout = pgstore.LayoutPartitioned })
	_, stop := w.start(part)
	w.send("a")
	testenv.WaitFor(t, time.Minute, "the command applied", func() bool {
		return w.count("SELECT count(*) FROM "+w.db.Table("applied")) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	legacy := w.config(func(c *worker.Config) { c.KeyLayout = pgstore.LayoutSingleTable; c.Group = part.Group + "-old" })
	wk, err := worker.New(w.db.Pool, legacy)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := wk.Run(ctx); !errors.Is(err, pgstore.ErrSingleTableClosed) {
		t.Fatalf("the legacy worker's Run returned %v, want ErrSingleTableClosed", err)
	}
	if n := w.count("SELECT coalesce(sum(n), 0)::int FROM " + w.db.Table("applied")); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	// Once the clean-up dropped the single table, such a worker stops at
	// start all the same, instead of waiting for the table.
	if _, err := w.db.Pool.Exec(context.Background(), "UPDATE "+w.db.Table("exactly_keys2_state")+" SET legacy = NULL; DROP TABLE "+
		w.db.Table("exactly_keys")); err != nil {
		t.Fatal(err)
	}
	wk, err = worker.New(w.db.Pool, legacy)
	if err != nil {
		t.Fatal(err)
	}
	if err := wk.Run(ctx); !errors.Is(err, pgstore.ErrSingleTableClosed) {
		t.Fatalf("after the drop, the legacy worker's Run returned %v, want ErrSingleTableClosed", err)
	}
}

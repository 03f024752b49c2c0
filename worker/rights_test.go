package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

// A worker on the partitioned key layout whose role may not run DDL is
// refused at start while it would run the key clean-up (which creates the
// partitions ahead: without it, claims would fail once they run out), and
// runs when its clean-up is left to another process.
func TestWorkerRefusesKeyCleanupWithoutRights(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	ctx := context.Background()
	owner, err := pgstore.New(w.db.Pool, &pgstore.Config{Schema: w.db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Check(ctx); err != nil { // the first partitions, as the owner
		t.Fatal(err)
	}
	rows := w.db.RowsOnlyPool(t)
	cfg := w.config(func(c *worker.Config) { c.KeyLayout = pgstore.LayoutPartitioned })
	wk, err := worker.New(rows, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = wk.Run(runCtx)
	if !errors.Is(err, dedupe.ErrMisconfigured) || runCtx.Err() != nil {
		t.Fatalf("Run as a role without DDL, with the key clean-up: %v; want a misconfiguration at once", err)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_keys2")); n != 0 {
		t.Fatalf("%d keys claimed by a refused worker", n)
	}

	cfg = w.config(func(c *worker.Config) { c.KeyLayout, c.CleanupInterval = pgstore.LayoutPartitioned, -1 })
	wk, err = worker.New(rows, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel = context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wk.Run(runCtx) }()
	w.send(ids(10)...)
	testenv.WaitFor(t, time.Minute, "10 messages applied", func() bool {
		return w.count("SELECT count(*) FROM "+w.db.Table("applied")+" WHERE n = 1") == 10
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

// One Scope on one topic in two consumer groups (two services that copied
// a configuration): the second group's worker refuses to start, naming
// both groups and the fix, instead of skipping every command the first
// applied as a duplicate; with TakeOver it takes the scope over, applies
// only what the first did not, and the first group is then refused.
func TestSecondGroupOnAScopeIsRefused(t *testing.T) {
	w := newWorld(t, 1)
	first, second := kafkatest.Name("first"), kafkatest.Name("second")
	cfg := func(group string, takeOver bool) *worker.Config {
		return w.config(func(c *worker.Config) { c.Group, c.TakeOver = group, takeOver })
	}
	_, stop := w.start(cfg(first, false))
	w.sendOnce(w.commands, "a")
	testenv.WaitFor(t, time.Minute, "a applied", func() bool { return w.appliedOnce() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	refused := func(group string, owner string) {
		t.Helper()
		wk, err := worker.New(w.db.Pool, cfg(group, false))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = wk.Run(ctx)
		var taken *pgstore.ScopeTakenError
		if !errors.As(err, &taken) || !errors.Is(err, dedupe.ErrMisconfigured) || taken.Owner.Group != owner ||
			!strings.Contains(err.Error(), "TakeOver") || !strings.Contains(err.Error(), "Scope of its own") {
			t.Fatalf("group %s: Run = %v; want a ScopeTakenError naming group %s and the fixes", group, err, owner)
		}
	}
	refused(second, first)
	w.sendOnce(w.commands, "b")
	if n := w.count("SELECT count(*) FROM " + w.db.Table("applied")); n != 1 {
		t.Fatalf("%d commands applied while the second group was refused, want 1", n)
	}

	_, stop = w.start(cfg(second, true))
	testenv.WaitFor(t, time.Minute, "b applied by the second group", func() bool { return w.appliedOnce() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n > 1"); n != 0 {
		t.Fatalf("%d commands applied twice", n)
	}
	refused(first, second)
}

// Postgres unavailable for a while just after the worker found it ready
// (a server that goes down again, a pooler refusing logins after the
// server's restart): the worker waits it out at the scope's registration,
// as it waits at start, and applies its commands once; it does not exit.
// The registration here fails with lock_not_available (a transient error)
// until the test lets go of the registry's table.
func TestScopeRegistrationWaitsOutAnUnavailableDatabase(t *testing.T) {
	w := newWorld(t, 1)
	ctx := context.Background()
	pcfg := w.db.Pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	hold, err := w.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	if _, err := hold.Exec(ctx, "LOCK TABLE "+w.db.Table("exactly_scopes")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	wk, err := worker.New(pool, w.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var runErr error
	go func() { runErr = wk.Run(runCtx); close(done) }()
	defer func() {
		cancel()
		<-done
	}()
	// Long enough for several registrations to fail.
	select {
	case <-done:
		t.Fatalf("the worker exited while the scope registry was unavailable: %v", runErr)
	case <-time.After(2 * time.Second):
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w.sendOnce(w.commands, "a")
	testenv.WaitFor(t, time.Minute, "a applied once", func() bool { return w.appliedOnce() == 1 })
}

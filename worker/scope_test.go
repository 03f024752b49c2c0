package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

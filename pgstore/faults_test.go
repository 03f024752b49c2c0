package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// The connection drops after the server received COMMIT and before its
// answer: Do runs the transaction again, finds the key it wrote itself and
// reports the message as applied (DecisionNew), not as a duplicate; fn ran
// once and its write is there once.
func TestDoCommitAnswerLost(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, nil)
	d := pgtest.NewCommitDropper(t)
	s, err := pgstore.New(d.Pool(t), &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var calls atomic.Int64
	d.Arm()
	c, err := s.Do(ctx, dedupetest.Req("s", "k", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		calls.Add(1)
		return []byte("r"), apply(ctx, db, tx, "k")
	})
	if d.Dropped() != 1 {
		t.Fatalf("the COMMIT's answer was dropped %d times, want 1", d.Dropped())
	}
	if err != nil || c.Decision != dedupe.DecisionNew || string(c.Record.Result) != "r" {
		t.Fatalf("Do = %v %q %v, want DecisionNew with the result", c.Decision, c.Record.Result, err)
	}
	if n, _ := applied(ctx, db, "k"); n != 1 || calls.Load() != 1 {
		t.Fatalf("applied %d times, fn ran %d times; want 1 and 1", n, calls.Load())
	}
	// A later call is a duplicate.
	c, err = s.Do(ctx, dedupetest.Req("s", "k", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if err != nil || c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("second Do = %v %v, want a duplicate", c.Decision, err)
	}
}

// The caller's context is cancelled (a middleware.Timeout firing) after fn's
// external effect succeeded: DoLease still completes the key, so the next
// delivery is a duplicate and the effect is not repeated.
func TestDoLeaseCompletesAfterCallerCancelled(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, nil)
	var effects atomic.Int64
	req := dedupetest.Req("payments", "p-1", "p")
	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.DoLease(ctx, req, time.Second, func(context.Context) ([]byte, error) {
		effects.Add(1) // the payment went through
		cancel()       // then the caller's timeout fires
		return []byte("paid"), nil
	})
	if err != nil {
		t.Fatalf("DoLease after the effect: %v", err)
	}
	for i := 0; i < 3; i++ {
		c, err := s.DoLease(context.Background(), req, time.Second, func(context.Context) ([]byte, error) {
			effects.Add(1)
			return nil, nil
		})
		if err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "paid" {
			t.Fatalf("delivery %d: %v %q %v, want the duplicate", i+2, c.Decision, c.Record.Result, err)
		}
	}
	if effects.Load() != 1 {
		t.Fatalf("the external effect ran %d times, want 1", effects.Load())
	}
	// A failure with a cancelled context releases the key all the same.
	fail := dedupetest.Req("payments", "p-2", "p")
	ctx, cancel = context.WithCancel(context.Background())
	_, err = s.DoLease(ctx, fail, time.Hour, func(context.Context) ([]byte, error) {
		cancel()
		return nil, errors.New("payment API down")
	})
	if err == nil || strings.Contains(err.Error(), "release") {
		t.Fatalf("err = %v, want the failure alone (released)", err)
	}
	c, err := s.DoLease(context.Background(), fail, time.Hour, func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || c.Decision != dedupe.DecisionTakeover {
		t.Fatalf("after a released failure: %v %v, want a takeover at once", c.Decision, err)
	}
}

// A table that is not where the store looks is a configuration error that
// names the fix, at start-up (Check) and on every call: never retryable,
// never permanent.
func TestMissingTableIsAConfigurationError(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	s, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"Check": s.Check(ctx),
		"Do": func() error {
			_, err := s.Do(ctx, dedupetest.Req("s", "k", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
			return err
		}(),
		"Acquire": func() error { _, err := s.Acquire(ctx, dedupetest.Req("s", "k", "p"), time.Minute); return err }(),
	} {
		if !errors.Is(err, dedupe.ErrMisconfigured) || dedupe.IsRetryable(err) || dedupe.IsPermanent(err) ||
			!strings.Contains(err.Error(), "42P01") || !strings.Contains(err.Error(), "migrations.Migrate") {
			t.Errorf("%s: err = %v, want a configuration error naming migrations.Migrate", name, err)
		}
	}
	good, _ := newStore(t, nil)
	if err := good.Check(ctx); err != nil {
		t.Fatalf("Check on a migrated schema: %v", err)
	}
}

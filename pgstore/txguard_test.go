package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/msgid"
	"github.com/exactly-go/exactly/internal/txguard"
)

// SQL that ends the transaction, whatever its spelling, is refused by the
// guard: else fn's writes and the key commit before fn returned, and an
// error fn returns after can no longer roll them back.
func TestGuardRefusesEveryCommit(t *testing.T) {
	s, db := newStore(t, nil)
	for i, sql := range []string{
		"COMMIT AND CHAIN",
		"/* c */ commit and chain",
		`SELECT E'\''; COMMIT AND CHAIN`,
		`SELECT 1 AS a$b$; COMMIT AND CHAIN; SELECT 1 AS c$b$`,
	} {
		t.Run(sql, func(t *testing.T) {
			ctx := context.Background()
			id := fmt.Sprintf("k%d", i)
			later := errors.New("a failure after the statement")
			_, err := s.Do(ctx, dedupetest.Req("g", id, "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				if err := apply(ctx, db, tx, id); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(ctx, sql); !errors.Is(err, txguard.ErrHandlerEndedTx) {
					t.Errorf("Exec(%q) = %v, want the guard's refusal", sql, err)
				}
				return nil, later
			})
			if err == nil {
				t.Fatal("Do succeeded")
			}
			if n, err := applied(ctx, db, id); err != nil || n != 0 {
				t.Errorf("fn failed, yet its effect committed %d times (%v)", n, err)
			}
			if rec, err := s.Get(ctx, dedupe.Key{Scope: "g", ID: id}); !errors.Is(err, dedupe.ErrNotFound) {
				t.Errorf("fn failed, yet its key is stored: %+v %v", rec, err)
			}
			// The retry: the effect must be applied once in all.
			c, err := s.Do(ctx, dedupetest.Req("g", id, "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				return nil, apply(ctx, db, tx, id)
			})
			if n, _ := applied(ctx, db, id); n != 1 {
				t.Fatalf("after the retry (%v, %v) the effect is applied %d times", c.Decision, err, n)
			}
		})
	}
}

// Legitimate SQL in a handler's transaction is not refused.
func TestGuardAllowsSavepointsAndLiterals(t *testing.T) {
	s, db := newStore(t, nil)
	for i, sql := range []string{
		"ROLLBACK TO SAVEPOINT s",
		"ROLLBACK WORK TO SAVEPOINT s",
		"ROLLBACK TRANSACTION TO s",
		"/* a /* nested */ ; end */ SELECT 1",
		`SELECT E'don\'t; commit later'`,
		"SELECT 1 AS \"end\"; SELECT 'a;commit'",
		"PREPARE q AS SELECT 1; DEALLOCATE q",
	} {
		t.Run(sql, func(t *testing.T) {
			ctx := context.Background()
			id := fmt.Sprintf("a%d", i)
			_, err := s.Do(ctx, dedupetest.Req("g", id, "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(ctx, sql); err != nil {
					return nil, err
				}
				return nil, apply(ctx, db, tx, id)
			})
			if err != nil {
				t.Fatalf("Exec(%q): %v", sql, err)
			}
		})
	}
}

// A handler's nested savepoints (pgx.BeginFunc on the handed transaction,
// and within it) commit and roll back as savepoints.
func TestGuardNestedSavepoints(t *testing.T) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	_, err := s.Do(ctx, dedupetest.Req("g", "n", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if err := apply(ctx, db, sp, "n1"); err != nil {
				return err
			}
			_ = pgx.BeginFunc(ctx, sp, func(sp2 pgx.Tx) error {
				if err := apply(ctx, db, sp2, "n2"); err != nil {
					return err
				}
				return errors.New("roll back the inner savepoint")
			})
			return nil
		})
		return nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	n1, _ := applied(ctx, db, "n1")
	n2, _ := applied(ctx, db, "n2")
	if n1 != 1 || n2 != 0 {
		t.Fatalf("n1 %d n2 %d, want 1 0", n1, n2)
	}
}

// A lease shorter than 3ns is accepted by Acquire; DoLease must not panic
// on it.
func TestDoLeaseTinyLease(t *testing.T) {
	s, _ := newStore(t, nil)
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("DoLease panicked: %v", p)
		}
	}()
	_, _ = s.DoLease(context.Background(), dedupetest.Req("g", "tiny", "p"), 2*time.Nanosecond,
		func(context.Context) ([]byte, error) { return nil, nil })
}

// The lease is extended while fn runs past it (both layouts); once
// another process takes the key over, fn's context ends with
// ErrLeaseLost, and the first holder's completion is refused.
func TestDoLeaseExtendedThenLost(t *testing.T) {
	eachLayout(t, func(t *testing.T, mk storeMaker) {
		s, _ := mk(t, nil)
		ctx := context.Background()
		// Long enough that a heartbeat's round trip fits well inside a
		// third of it on a busy machine: the test is of the extension, not
		// of a database too slow to extend.
		const lease = 2 * time.Second
		req := dedupetest.Req("g", "long", "p")
		entered := make(chan struct{})
		done := make(chan error, 1)
		var cause error
		go func() {
			_, err := s.DoLease(ctx, req, lease, func(ctx context.Context) ([]byte, error) {
				close(entered)
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
					return []byte("late"), nil // ignores its context: its completion must be refused
				case <-time.After(20 * time.Second):
					return nil, errors.New("fn's context never ended")
				}
			})
			done <- err
		}()
		<-entered
		// Well past the lease, a duplicate still finds the key in flight.
		deadline := time.Now().Add(3 * lease)
		for time.Now().Before(deadline) {
			c, err := s.Acquire(ctx, req, lease)
			if err == nil && c.Decision.Run() {
				t.Fatalf("a duplicate took the key over while fn runs: %v", c.Decision)
			}
			if err != nil && !errors.Is(err, dedupe.ErrInFlight) {
				var inflight *dedupe.InFlightError
				if !errors.As(err, &inflight) {
					t.Fatalf("duplicate: %v", err)
				}
			}
			time.Sleep(50 * time.Millisecond) // poll
		}
		// Another process releases and takes the key (as after a restore).
		// The first holder's heartbeat may extend the lease again between
		// the release and the takeover: release again until the takeover
		// wins.
		var c dedupe.Claim
		for tries := 0; ; tries++ {
			if err := s.Release(ctx, dedupe.Claim{Record: dedupe.Record{Key: req.Key, Attempts: 1}}); err != nil {
				t.Fatal(err)
			}
			var err error
			c, err = s.Acquire(ctx, req, time.Minute)
			if err == nil && c.Decision.Run() {
				break
			}
			if !errors.Is(err, dedupe.ErrInFlight) || tries == 50 {
				t.Fatalf("takeover: %v %v", c.Decision, err)
			}
		}
		err := <-done
		if !errors.Is(cause, dedupe.ErrLeaseLost) {
			t.Fatalf("fn's context ended with %v, want ErrLeaseLost", cause)
		}
		if !errors.Is(err, dedupe.ErrLeaseLost) {
			t.Fatalf("first holder's DoLease = %v, want its completion refused", err)
		}
		if err := s.Complete(ctx, c, []byte("second")); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, req.Key)
		if err != nil || string(got.Result) != "second" {
			t.Fatalf("stored %q %v", got.Result, err)
		}
	})
}

// An HTTP request's derived message ID for a key that is no UUIDv7 carries
// the Unix epoch's time bits: a downstream partitioned key store must
// still find its second delivery a duplicate, after a clean-up too.
func TestPartitionedAcceptsEpochDerivedIDs(t *testing.T) {
	s, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	id := msgid.DeriveRequest("http", "4:acme/k1", "k1", 0)
	req := dedupetest.Req("consumer", id, "p")
	run := func() dedupe.Claim {
		c, err := s.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return nil, apply(ctx, db, tx, id) })
		if err != nil {
			t.Fatalf("Do(%s): %v", id, err)
		}
		return c
	}
	run()
	if _, err := s.Cleanup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if c := run(); c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("second delivery of %s: %v", id, c.Decision)
	}
	if n, _ := applied(ctx, db, id); n != 1 {
		t.Fatalf("applied %d times", n)
	}
}

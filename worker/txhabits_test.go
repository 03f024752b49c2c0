package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/worker"
)

// breakTx is a habit of a handler that ends or breaks the transaction it
// was handed, and the words its dead letter's reason must contain.
type breakTx struct {
	name   string
	reason string
	do     func(ctx context.Context, tx pgx.Tx) error
}

var txHabits = []breakTx{
	// Commits and returns nil: before, the command was applied but its
	// outputs were lost (per message), or the next command's key was
	// committed with it and that command never applied (batch).
	{"commit", "called Commit", func(ctx context.Context, tx pgx.Tx) error { _ = tx.Commit(ctx); return nil }},
	// Commits and returns Commit's error.
	{"commit-returned", "called Commit", func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) }},
	// Rolls back and returns nil: before, retried for ever.
	{"rollback", "called Rollback", func(ctx context.Context, tx pgx.Tx) error { _ = tx.Rollback(ctx); return nil }},
	// Ends it with SQL of its own.
	{"sql-commit", "COMMIT (as SQL)", func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, "COMMIT"); return err }},
	// Swallows a failed statement's error.
	{"swallowed", "a statement in its transaction failed", func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return nil
	}},
	// Ends it past the guard's reading of its SQL: through a savepoint's
	// handle, or in SQL that the guard's splitter misreads (an E-string
	// with an escaped quote).
	{"savepoint-commit", "COMMIT", func(ctx context.Context, tx pgx.Tx) error {
		_ = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { _, err := sp.Exec(ctx, "COMMIT"); return err })
		return nil
	}},
	{"estring-commit", "COMMIT", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT E'\''; COMMIT`)
		return err
	}},
}

// A handler that ends or breaks the transaction the worker handed it
// cannot lose a command or stall its partition: its command goes to the
// dead-letter topic with a reason that names the rule, nothing of it is
// applied, and the commands around it are applied once, with their outputs
// published.
func TestHandlerThatEndsItsTransaction(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		for _, habit := range txHabits {
			t.Run(mode+"/"+habit.name, func(t *testing.T) {
				t.Parallel()
				w := newWorld(t, 1)
				misbehave := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
					if strings.HasPrefix(msg.UUID, "bad") {
						return habit.do(ctx, tx)
					}
					return nil
				}
				cfg := w.config(func(c *worker.Config) {
					c.Handler = func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
						outs, err := w.handler(ctx, tx, msg)
						if err != nil {
							return nil, err
						}
						return outs, misbehave(ctx, tx, msg)
					}
					if mode == "batch" {
						c.Handler, c.BatchSize = nil, 10
						c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
							outs, err := w.batchHandler(ctx, tx, msgs)
							if err != nil {
								return nil, err
							}
							for _, m := range msgs {
								if err := misbehave(ctx, tx, m); err != nil {
									return nil, err
								}
							}
							return outs, nil
						}
					}
				})
				_, stop := w.start(cfg)
				w.sendOnce(w.commands, "ok-1", "bad-1", "ok-2", "ok-3")
				testenv.WaitFor(t, time.Minute, "all four offsets committed", func() bool { return w.committed(cfg.Group, w.commands) == 4 })
				if !waitUntil(time.Minute, func() bool { return w.records(w.events, 3) == 3 }) {
					t.Errorf("outputs published: %d of 3; applied once: %d; rows of the bad command: %d",
						w.records(w.events, 3), w.appliedOnce(), w.count("SELECT count(*) FROM "+w.db.Table("applied")+" WHERE id LIKE 'bad%'"))
				}
				if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				if n := w.appliedOnce(); n != 3 {
					t.Errorf("%d commands applied once, want 3 (ok-1, ok-2, ok-3)", n)
				}
				if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE id LIKE 'bad%' OR n > 1"); n != 0 {
					t.Errorf("%d rows of the bad command or of a command applied twice, want 0", n)
				}
				if n := w.records(w.events, 3); n != 3 {
					t.Errorf("%d outputs on the events topic, want 3", n)
				}
				letters := kafkatest.ReadAll(t, w.dlq, 1, time.Minute)
				if len(letters) != 1 {
					t.Fatalf("%d dead letters, want 1", len(letters))
				}
				var reason string
				for _, h := range letters[0].Headers {
					if h.Key == middleware.ReasonForPoisonedKey {
						reason = string(h.Value)
					}
				}
				if !strings.Contains(reason, "belongs to the library") || !strings.Contains(reason, habit.reason) {
					t.Errorf("the dead letter's reason %q does not name the rule (%q)", reason, habit.reason)
				}
			})
		}
	}
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

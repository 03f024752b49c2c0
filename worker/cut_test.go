package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/worker"
)

// An attempt cut by Timeout while the handler waits for a lock another
// session holds is not the command's fault: however often it is cut, the
// command is neither dead-lettered nor committed, and once the lock is gone
// it is applied once.
func TestCutWhileWaitingForALockIsRetried(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 1)
			cfg := w.config(func(c *worker.Config) {
				c.Timeout, c.MaxAttempts = 500*time.Millisecond, 3
				if mode == "batch" {
					c.Handler, c.BatchSize = nil, 10
					c.BatchHandler = w.batchHandler
				}
			})
			wk, stop := w.start(cfg)
			<-wk.Running()
			ctx := context.Background()
			locker, err := w.db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = locker.Rollback(ctx) }()
			if _, err := locker.Exec(ctx, "LOCK TABLE "+w.db.Table("applied")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			w.sendOnce(w.commands, "a")
			// Well past MaxAttempts cuts of 500ms each.
			time.Sleep(5 * time.Second)
			if n := w.records(w.dlq, 1); n != 0 {
				t.Fatalf("%d dead letters while another session held a lock, want 0", n)
			}
			if n := w.committed(cfg.Group, w.commands); n != 0 {
				t.Fatalf("committed offset %d while the command waited for a lock, want 0", n)
			}
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, time.Minute, "the command applied after the lock", func() bool { return w.appliedOnce() == 1 })
			testenv.WaitFor(t, time.Minute, "its offset committed", func() bool { return w.committed(cfg.Group, w.commands) == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := w.records(w.dlq, 1); n != 0 {
				t.Fatalf("%d dead letters, want 0", n)
			}
		})
	}
}

// A command whose own work always outlasts Timeout (a slow statement, or
// slow code of its handler) ends on the dead-letter topic after MaxAttempts
// cuts, and the command behind it on its partition is applied.
func TestCommandSlowerThanTimeoutIsDeadLettered(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		for _, slow := range []string{"statement", "code"} {
			t.Run(mode+"/"+slow, func(t *testing.T) {
				w := newWorld(t, 1)
				work := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
					if msg.UUID == "slow" {
						if slow == "statement" {
							if _, err := tx.Exec(ctx, "SELECT pg_sleep(5)"); err != nil {
								return nil, err
							}
						} else {
							select {
							case <-time.After(5 * time.Second):
							case <-ctx.Done():
								return nil, ctx.Err()
							}
						}
					}
					return w.handler(ctx, tx, msg)
				}
				cfg := w.config(func(c *worker.Config) {
					c.Timeout, c.MaxAttempts = 500*time.Millisecond, 3
					c.Handler = work
					if mode == "batch" {
						c.Handler, c.BatchSize = nil, 10
						c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
							outs := make([][]*message.Message, len(msgs))
							for i, m := range msgs {
								o, err := work(ctx, tx, m)
								if err != nil {
									return nil, err
								}
								outs[i] = o
							}
							return outs, nil
						}
					}
				})
				_, stop := w.start(cfg)
				w.sendOnce(w.commands, "before", "slow", "after")
				testenv.WaitFor(t, 2*time.Minute, "all three committed", func() bool { return w.committed(cfg.Group, w.commands) == 3 })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				if n := w.records(w.dlq, 1); n != 1 {
					t.Fatalf("%d dead letters, want 1 (the slow command)", n)
				}
				if n := w.appliedOnce(); n != 2 {
					t.Fatalf("%d commands applied once, want 2 (before and after)", n)
				}
				if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE id = 'slow' OR n > 1"); n != 0 {
					t.Fatalf("the slow command applied, or a command applied twice")
				}
			})
		}
	}
}

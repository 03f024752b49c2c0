package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// Two batches of different accounts that create the same holds, at once,
// insert them in the same order: one waits for the other and gets a
// retryable error (it runs again and sees the holds), and none deadlocks
// (SQLSTATE 40P01, which Postgres detects after deadlock_timeout, and the
// store would retry). A third transaction holds the last hold's id
// uncommitted until both batches wait, so that their inserts overlap; in
// map order, they deadlock in most rounds.
func TestBatchOverlappingHoldsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(db.Pool, Config{Schema: db.Schema, Brokers: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("accounts")+" (id, available) VALUES ('acc-a', 1000000), ('acc-b', 1000000)"); err != nil {
		t.Fatal(err)
	}
	const rounds, holds = 5, 50
	deadlocks, waited := 0, 0
	for r := range rounds {
		hold := func(i int) string { return fmt.Sprintf("h-%d-%03d", r, i) }
		blocker, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := blocker.Exec(ctx, "INSERT INTO "+db.Table("holds")+" (id, account, amount) VALUES ($1, 'acc-c', 1)", hold(holds-1)); err != nil {
			t.Fatal(err)
		}
		results := make(chan error, 2)
		var pids []int32
		for _, account := range []string{"acc-a", "acc-b"} {
			msgs := make([]*message.Message, holds)
			for i := range msgs {
				msgs[i] = commandMsg(t, Command{CommandID: fmt.Sprintf("%s-%d-%d", account, r, i), Type: Hold, Account: account, Amount: 1, HoldID: hold(i)})
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var pid int32
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
			go func() {
				defer tx.Rollback(context.WithoutCancel(ctx))
				if _, err := w.handleBatch(ctx, tx, msgs); err != nil {
					results <- err
					return
				}
				results <- tx.Commit(ctx)
			}()
		}
		testenv.WaitFor(t, time.Minute, "both batches to wait for a hold", func() bool {
			var n int
			_ = db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND wait_event_type = 'Lock'", pids).Scan(&n)
			return n == 2 || len(results) > 0
		})
		if err := blocker.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			err := <-results
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pgErr) && pgErr.Code == "40P01":
				deadlocks++
			case dedupe.IsRetryable(err):
				waited++ // the other batch created the holds meanwhile
			default:
				t.Fatalf("round %d: %v", r, err)
			}
		}
	}
	if deadlocks > 0 {
		t.Fatalf("%d deadlocks in %d rounds of two batches creating the same %d holds", deadlocks, rounds, holds)
	}
	// Each round's holds were created once, by one of the two batches.
	got, err := Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("holds")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if held := got["acc-a"].Held + got["acc-b"].Held; n != rounds*holds || held != rounds*holds {
		t.Fatalf("%d holds, %d held, want %d and %d", n, held, rounds*holds, rounds*holds)
	}
	t.Logf("%d rounds: %d batches waited for the other's holds", rounds, waited)
}

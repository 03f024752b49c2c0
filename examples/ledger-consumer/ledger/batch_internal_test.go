package ledger

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

func commandMsg(t *testing.T, c Command) *message.Message {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return message.NewMessage(c.CommandID, payload)
}

// Two batches of different accounts create the same hold at once: the one
// that waited for the other's insert gets a retryable error (and the batch
// runs again, which then rejects the hold), never a debit without its hold.
func TestBatchHoldCreatedMeanwhile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorker(db.Pool, Config{Schema: db.Schema, Brokers: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("accounts")+" (id, available) VALUES ('acc-a', 100), ('acc-b', 100)"); err != nil {
		t.Fatal(err)
	}
	tx1, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if _, err := w.handleBatch(ctx, tx1, []*message.Message{commandMsg(t, Command{CommandID: "c1", Type: Hold, Account: "acc-a", Amount: 10, HoldID: "shared"})}); err != nil {
		t.Fatal(err)
	}
	tx2, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	var pid int
	if err := tx2.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	second := []*message.Message{commandMsg(t, Command{CommandID: "c2", Type: Hold, Account: "acc-b", Amount: 20, HoldID: "shared"})}
	done := make(chan error, 1)
	go func() { _, err := w.handleBatch(ctx, tx2, second); done <- err }()
	testenv.WaitFor(t, 30*time.Second, "the second batch to wait for the first's hold", func() bool {
		var waiting bool
		_ = db.Pool.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting)
		return waiting
	})
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !dedupe.IsRetryable(err) {
		t.Fatalf("second batch: %v, want a retryable error", err)
	}
	_ = tx2.Rollback(ctx)
	// Run again, the hold is there: a rejection, and acc-b keeps its money.
	tx3, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx3.Rollback(ctx)
	outs, err := w.handleBatch(ctx, tx3, second)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx3.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var ev eventPayload
	if err := json.Unmarshal(outs[0][0].Payload, &ev); err != nil || ev.Outcome != "rejected" {
		t.Fatalf("event %s, want a rejection", outs[0][0].Payload)
	}
	got, err := Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if got["acc-a"] != (Account{Available: 90, Held: 10}) || got["acc-b"] != (Account{Available: 100}) {
		t.Fatalf("balances %v", got)
	}
}

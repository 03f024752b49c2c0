package ledger_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// A hold ID asked for by two accounts whose records are on different
// partitions: whichever is consumed first creates it, and Kafka orders
// nothing across partitions. Here partition 1's hold is applied first; a
// recomputation that reads partition 0 first would give the hold to the
// other account and report two accounts wrong (available and held swapped
// by the amounts, totals equal) for a worker that did nothing wrong. Verify
// must say that the log cannot be recomputed in one order instead, and
// the generated workloads must never name one hold from two accounts.
func TestVerifyRefusesHoldsWhoseOwnerDependsOnPartitionOrder(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	commands := kafkatest.Topic(t, 2)
	group := kafkatest.Name("g")
	w, err := ledger.NewWorker(db.Pool, ledger.Config{Schema: db.Schema, Brokers: brokers, Commands: commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	pw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: commands, Balancer: explicitPartition{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	defer pw.Close()
	produceAndWait := func(recs ...kafka.Message) {
		t.Helper()
		if err := pw.WriteMessages(ctx, recs...); err != nil {
			t.Fatal(err)
		}
		end := kafkatest.EndOffsets(t, commands, 2)
		testenv.WaitFor(t, 3*time.Minute, "the worker to catch up", func() bool {
			got := kafkatest.CommittedOffsets(t, group, commands, 2)
			return got[0] == end[0] && got[1] == end[1]
		})
	}
	id := watermill.NewUUID
	produceAndWait(record(t, 1, ledger.Command{CommandID: id(), Type: ledger.Topup, Account: "acc-b", Amount: 100}),
		record(t, 1, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: "acc-b", Amount: 50, HoldID: "shared"}))
	produceAndWait(record(t, 0, ledger.Command{CommandID: id(), Type: ledger.Topup, Account: "acc-a", Amount: 100}),
		record(t, 0, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: "acc-a", Amount: 30, HoldID: "shared"}))

	got, err := ledger.Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := got["acc-a"], got["acc-b"]; a != (ledger.Account{Available: 100}) || b != (ledger.Account{Available: 50, Held: 50}) {
		t.Fatalf("balances a %+v b %+v, want the hold on b, applied first", a, b)
	}
	rep, err := ledger.Verify(ctx, db.Pool, db.Schema, brokers, commands)
	if !errors.Is(err, ledger.ErrOrderDependent) {
		t.Fatalf("Verify: %v, mismatches %v; want ledger.ErrOrderDependent", err, rep.Mismatches)
	}

	// The generator gives every hold an ID of its own.
	wl, err := ledger.Generate(ledger.LoadConfig{Commands: 20000, Accounts: 40, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, r := range wl.Records {
		c, err := ledger.Parse(r.Value)
		if err != nil || c.Type != ledger.Hold {
			continue
		}
		if o, ok := owner[c.HoldID]; ok && o != c.Account {
			t.Fatalf("hold %s named by %s and %s", c.HoldID, o, c.Account)
		}
		owner[c.HoldID] = c.Account
	}
}

package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// explicitPartition writes each record to the partition it names, as a
// producer with another partitioner (or a copy by another tool) would.
type explicitPartition struct{}

func (explicitPartition) Balance(m kafka.Message, _ ...int) int { return m.Partition }

func record(t *testing.T, partition int, c ledger.Command) kafka.Message {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return kafka.Message{Partition: partition, Key: []byte(c.Account), Value: payload,
		Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(c.CommandID)}}}
}

// One account's commands processed on two partitions at once (another
// partitioner, a partition-count increase, a copied topic): every command
// must still apply exactly once. Each account is new, so both transactions
// race to create it; holds race on one account, and one hold ID is claimed
// by two accounts at once.
func TestCommandsOfOneAccountOnTwoPartitions(t *testing.T) {
	t.Parallel()
	commandsOnTwoPartitions(t, 0)
}

// The same in batch mode: the two partitions' batches run at once, lock
// overlapping accounts and race for the shared holds.
func TestCommandsOfOneAccountOnTwoPartitionsBatch(t *testing.T) {
	t.Parallel()
	commandsOnTwoPartitions(t, 50)
}

func commandsOnTwoPartitions(t *testing.T, batch int) {
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	commands := kafkatest.Topic(t, 2)
	group := kafkatest.Name("g")
	w, err := ledger.NewWorker(db.Pool, ledger.Config{Schema: db.Schema, Brokers: brokers, Commands: commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, Batch: batch, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()

	pw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: commands, Balancer: explicitPartition{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 5 * time.Millisecond}
	defer pw.Close()
	produceAndWait := func(recs []kafka.Message) {
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
	const n = 150
	acc := func(i int) string { return fmt.Sprintf("acc-%03d", i) }
	id := watermill.NewUUID

	// Phase 1: new accounts. Partition 0 tops up by 100; partition 1 by
	// 1000, then carries a byte-identical copy of partition 0's top-up.
	var p0, p1 []kafka.Message
	for i := range n {
		a := record(t, 0, ledger.Command{CommandID: id(), Type: ledger.Topup, Account: acc(i), Amount: 100})
		p0 = append(p0, a)
		p1 = append(p1, record(t, 1, ledger.Command{CommandID: id(), Type: ledger.Topup, Account: acc(i), Amount: 1000}))
		cp := a
		cp.Partition = 1
		p1 = append(p1, cp)
	}
	produceAndWait(append(p0, p1...))

	// Phase 2: holds. On each account, hold 10 on partition 0 and 20 on
	// partition 1 (plus a byte-identical copy of the first); and one hold
	// ID, shared-i, asked for by account i on partition 0 and account i+1
	// on partition 1: only one of them may create it.
	p0, p1 = nil, nil
	for i := range n {
		h := record(t, 0, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: acc(i), Amount: 10, HoldID: "a-" + acc(i)})
		p0 = append(p0, h,
			record(t, 0, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: acc(i), Amount: 7, HoldID: fmt.Sprint("shared-", i)}))
		cp := h
		cp.Partition = 1
		p1 = append(p1, record(t, 1, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: acc(i), Amount: 20, HoldID: "b-" + acc(i)}),
			cp,
			record(t, 1, ledger.Command{CommandID: id(), Type: ledger.Hold, Account: acc((i + 1) % n), Amount: 5, HoldID: fmt.Sprint("shared-", i)}))
	}
	produceAndWait(append(p0, p1...))

	got, err := ledger.Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	rows, err := db.Pool.Query(ctx, "SELECT account, amount - captured - released FROM "+db.Table("holds"))
	if err != nil {
		t.Fatal(err)
	}
	holds := 0
	for rows.Next() {
		var a string
		var rem int64
		if err := rows.Scan(&a, &rem); err != nil {
			t.Fatal(err)
		}
		held[a] += rem
		holds++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wrong := 0
	for i := range n {
		a := got[acc(i)]
		// Every account got 1100, holds only move money from available to held.
		if a.Available+a.Held != 1100 || a.Held != held[acc(i)] || a.Held < 30 || a.Held > 30+7+5 {
			if wrong < 5 {
				t.Errorf("%s: available %d held %d, holds on it %d; want available+held 1100 and held 30..42 = its holds", acc(i), a.Available, a.Held, held[acc(i)])
			}
			wrong++
		}
	}
	if wrong > 0 || len(got) != n || holds != 3*n {
		t.Fatalf("%d of %d accounts wrong; %d accounts, %d holds (want %d)", wrong, n, len(got), holds, 3*n)
	}
}

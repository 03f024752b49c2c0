package kafkapubsub_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// A database restored to before a partition's first position save (an
// asynchronous standby promoted, a restore from a backup taken before
// positions were turned on) has no row for the partition while Kafka's
// committed offset is past what the database kept. Kafka's commits of a
// Subscriber with Positions say so: the partition starts again at the
// oldest record Kafka holds, with the member stopped across the restore
// and with the member running through it, and nothing is skipped.
func TestPositionsRestoreBeforeFirstSave(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	cfg := &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond,
		Logger: quietLogger()}
	load := func() map[int]int64 {
		t.Helper()
		got, err := positions.Load(ctx, group, topic, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	restore := func() {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, "DELETE FROM "+db.Table("exactly_positions")); err != nil {
			t.Fatal(err)
		}
	}
	settled := func(what string, d *deliveries, n int, want map[int]int64) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, what, func() bool {
			return len(d.of(0)) >= n && maps.Equal(load(), want) &&
				maps.Equal(kafkatest.CommittedOffsets(t, group, topic, 1), want)
		})
	}

	produceKeyed(t, brokers, topic, 10, 4)
	d, stop := consumeAll(t, cfg, topic)
	settled("10 records to be consumed, saved and committed", d, 10, map[int]int64{0: 10})
	stop()

	// Stopped across the restore: the row is gone, Kafka says 10.
	restore()
	produceKeyed(t, brokers, topic, 10, 4)
	d, stop = consumeAll(t, cfg, topic)
	settled("the restored partition to be consumed again from the oldest record", d, 20, map[int]int64{0: 20})
	stop()
	if got, want := d.of(0), offsetRange(0, 20); !slicesEqual(got, want) {
		t.Fatalf("after a restore to before the first position (member stopped), delivered %v, want %v", got, want)
	}

	// Running through the restore: its next save finds no row.
	d, stop = consumeAll(t, cfg, topic)
	produceKeyed(t, brokers, topic, 2, 2)
	settled("the member to save 22", d, 2, map[int]int64{0: 22})
	restore()
	produceKeyed(t, brokers, topic, 10, 4)
	settled("the member to fence itself and consume again from the oldest record", d, 2+32, map[int]int64{0: 32})
	stop()
	// Before the fence the member may have run ahead past 22; after it,
	// everything from the oldest record, in order.
	got := d.of(0)
	i := slices.Index(got, 0)
	if i < 2 || !slicesEqual(got[:2], offsetRange(20, 22)) || !slicesEqual(got[i:], offsetRange(0, 32)) {
		t.Fatalf("after a restore to before the first position (member running), delivered %v, want 20 21 (and maybe more), then 0 to 31", got)
	}
}

// The same restore under the dedupe middleware, as a worker runs it: 10
// commands applied and saved, the database restored to before the first
// save (no applied rows, no keys, no positions), 10 more commands: every
// one of the 20 is applied, once.
func TestPositionsRestoreBeforeFirstSaveApplied(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	applied := db.Table("applied")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (uuid text NOT NULL, kafka_offset bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	handle := mw.Middleware(consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, m *message.Message) ([]*message.Message, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, $2)", m.UUID, m.Metadata.Get(kafkapubsub.MetadataOffset))
		return nil, err
	}))
	run := func() (stop func()) {
		sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: store.Positions(),
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for m := range ch {
				if _, err := handle(m); err != nil {
					m.Nack()
					continue
				}
				m.Ack()
			}
		}()
		return func() { _ = sub.Close(); <-done }
	}
	count := func(q string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	settled := func(what string, rows int, want map[int]int64) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, what, func() bool {
			got, err := store.Positions().Load(ctx, group, topic, []int{0})
			return err == nil && count("SELECT count(DISTINCT uuid) FROM "+applied) == rows && maps.Equal(got, want) &&
				maps.Equal(kafkatest.CommittedOffsets(t, group, topic, 1), want)
		})
	}

	produce := func(n int) {
		t.Helper()
		msgs := make([]kafka.Message, n)
		for i := range msgs {
			msgs[i] = kafka.Message{Value: []byte("cmd"), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(watermill.NewUUID())}}}
		}
		wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
		defer wr.Close()
		if err := wr.WriteMessages(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	produce(10)
	stop := run()
	settled("10 commands applied, saved and committed", 10, map[int]int64{0: 10})
	stop()
	db.DeleteKeys(t, "")
	for _, q := range []string{"DELETE FROM " + applied, "DELETE FROM " + db.Table("exactly_positions")} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	produce(10)
	stop = run()
	settled("the 20 commands applied after the restore", 20, map[int]int64{0: 20})
	stop()
	if n := count("SELECT count(*) FROM " + applied); n != 20 {
		t.Fatalf("%d rows applied for 20 commands", n)
	}
	if n := count("SELECT count(DISTINCT kafka_offset) FROM " + applied); n != 20 {
		t.Fatalf("%d distinct offsets applied for 20 commands", n)
	}
}

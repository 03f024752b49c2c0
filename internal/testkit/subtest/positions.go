package subtest

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

// With Positions, each commit saves the positions in the database, and a
// partition starts at the earlier of Kafka's committed offset and the
// database's position: a database that lost commits gets what it lost
// again, also under a running member; a group unknown to Kafka starts at
// the database's position; a failed save commits nothing to Kafka either.
func Positions(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions = 2
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	ProduceKeyed(t, brokers, topic, 40, 8)
	end := kafkatest.EndOffsets(t, topic, partitions)
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	cfg := func(group string) *kafkapubsub.SubscriberConfig {
		return &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond,
			Logger: Logger()}
	}
	load := func(group string) map[int]int64 {
		t.Helper()
		got, err := positions.Load(ctx, group, topic, []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// Everything consumed: the database and Kafka agree.
	_, stop := consumeAll(t, tr, cfg(group), topic)
	WaitCommitted(t, group, topic, partitions, 60*time.Second)
	stop()
	if got := load(group); !maps.Equal(got, end) {
		t.Fatalf("positions %v after everything was consumed, want the end offsets %v", got, end)
	}

	// The database lost its last commits on partition 0: its position is
	// 3 records back, Kafka's committed offset is at the end.
	lost := end[0] - 3
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: lost}, nil); err != nil {
		t.Fatal(err)
	}
	d, stop := consumeAll(t, tr, cfg(group), topic)
	testenv.WaitFor(t, 60*time.Second, "the 3 records the database lost to be delivered and saved again", func() bool {
		return len(d.of(0)) == 3 && load(group)[0] == end[0]
	})
	stop()
	if got, want := d.of(0), offsetRange(lost, end[0]); !slicesEqual(got, want) {
		t.Fatalf("partition 0 delivered %v, want %v", got, want)
	}
	if got := d.of(1); len(got) != 0 {
		t.Fatalf("partition 1, whose position is Kafka's, delivered %v again", got)
	}

	// The database goes back in time under a running member (a failover
	// that the process lives through): its next save finds the database
	// behind what it saved, stores nothing, and the member starts its
	// partitions again from the database's positions.
	d, stop = consumeAll(t, tr, cfg(group), topic)
	ProduceKeyed(t, brokers, topic, 16, 8)
	mid := kafkatest.EndOffsets(t, topic, partitions)
	testenv.WaitFor(t, 60*time.Second, "the running member to save the new records' positions", func() bool {
		return maps.Equal(load(group), mid)
	})
	lost = mid[0] - 3
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: lost}, nil); err != nil {
		t.Fatal(err)
	}
	ProduceKeyed(t, brokers, topic, 16, 8)
	last := kafkatest.EndOffsets(t, topic, partitions)
	testenv.WaitFor(t, 60*time.Second, "the records lost under the running member to be delivered again", func() bool {
		n := 0
		for _, o := range d.of(0) {
			if o == lost {
				n++
			}
		}
		return n == 2 && maps.Equal(load(group), last)
	})
	stop()
	WaitCommitted(t, group, topic, partitions, 60*time.Second)
	end = last

	// A group Kafka does not know (its offsets expired, say) starts at the
	// database's positions, not at StartOffset.
	other := kafkatest.Name("g")
	if _, err := positions.Save(ctx, other, topic, map[int]int64{0: end[0] - 2, 1: end[1] - 1}, nil); err != nil {
		t.Fatal(err)
	}
	d, stop = consumeAll(t, tr, cfg(other), topic)
	WaitCommitted(t, other, topic, partitions, 60*time.Second)
	stop()
	if got, want := d.of(0), offsetRange(end[0]-2, end[0]); !slicesEqual(got, want) {
		t.Fatalf("partition 0 of a group unknown to Kafka delivered %v, want %v", got, want)
	}
	if got, want := d.of(1), offsetRange(end[1]-1, end[1]); !slicesEqual(got, want) {
		t.Fatalf("partition 1 of a group unknown to Kafka delivered %v, want %v", got, want)
	}

	// A save that fails commits nothing to Kafka: every save is refused
	// (a constraint no new position meets), messages are delivered and
	// acked, and after the last commit (Close) Kafka's offsets are where
	// they were.
	third := kafkatest.Name("g")
	if _, err := positions.Save(ctx, third, topic, map[int]int64{0: 0, 1: 0}, nil); err != nil {
		t.Fatal(err)
	}
	before := kafkatest.CommittedOffsets(t, third, topic, partitions)
	if _, err := db.Pool.Exec(ctx, "ALTER TABLE "+db.Table("exactly_positions")+" ADD CONSTRAINT refuse CHECK (next_offset < 0) NOT VALID"); err != nil {
		t.Fatal(err)
	}
	d, stop = consumeAll(t, tr, cfg(third), topic)
	testenv.WaitFor(t, 60*time.Second, "every record to be delivered", func() bool {
		return int64(len(d.of(0))) == end[0] && int64(len(d.of(1))) == end[1]
	})
	stop()
	if after := kafkatest.CommittedOffsets(t, third, topic, partitions); !maps.Equal(after, before) {
		t.Fatalf("Kafka's committed offsets went from %v to %v while no position could be saved", before, after)
	}
}

// Positions need a consumer group.
func PositionsNeedAGroup(t *testing.T, tr Transport) {
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	_, err = tr.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, Positions: store.Positions()})
	if err == nil {
		t.Fatal("a Subscriber with Positions and no ConsumerGroup was accepted")
	}
}

// A database restored to before a partition's first position save (an
// asynchronous standby promoted, a restore from a backup taken before
// positions were turned on) has no row for the partition while Kafka's
// committed offset is past what the database kept. Kafka's commits of a
// Subscriber with Positions say so: the partition starts again at the
// oldest record Kafka holds, with the member stopped across the restore
// and with the member running through it, and nothing is skipped.
func PositionsRestoreBeforeFirstSave(t *testing.T, tr Transport) {
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
		Logger: Logger()}
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

	ProduceKeyed(t, brokers, topic, 10, 4)
	d, stop := consumeAll(t, tr, cfg, topic)
	settled("10 records to be consumed, saved and committed", d, 10, map[int]int64{0: 10})
	stop()

	// Stopped across the restore: the row is gone, Kafka says 10.
	restore()
	ProduceKeyed(t, brokers, topic, 10, 4)
	d, stop = consumeAll(t, tr, cfg, topic)
	settled("the restored partition to be consumed again from the oldest record", d, 20, map[int]int64{0: 20})
	stop()
	if got, want := d.of(0), offsetRange(0, 20); !slicesEqual(got, want) {
		t.Fatalf("after a restore to before the first position (member stopped), delivered %v, want %v", got, want)
	}

	// Running through the restore: its next save finds no row.
	d, stop = consumeAll(t, tr, cfg, topic)
	ProduceKeyed(t, brokers, topic, 2, 2)
	settled("the member to save 22", d, 2, map[int]int64{0: 22})
	restore()
	ProduceKeyed(t, brokers, topic, 10, 4)
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
func PositionsRestoreBeforeFirstSaveApplied(t *testing.T, tr Transport) {
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
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	handle := mw.Middleware(consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, m *message.Message) ([]*message.Message, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, $2)", m.UUID, m.Metadata.Get(kafkapubsub.MetadataOffset))
		return nil, err
	}))
	run := func() (stop func()) {
		sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: store.Positions(),
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: Logger()})
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

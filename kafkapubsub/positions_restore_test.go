package kafkapubsub_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

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

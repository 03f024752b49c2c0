package kgopubsub_test

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// deliveries records which offsets of which partitions were delivered.
type deliveries struct {
	mu  sync.Mutex
	got map[int][]int64
}

func (d *deliveries) of(p int) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.got[p]...)
}

// consumeAll runs a Subscriber with cfg on topic that acks every message,
// until stop is called (which closes it: its last commit is done when stop
// returns).
func consumeAll(t *testing.T, cfg *kafkapubsub.SubscriberConfig, topic string) (d *deliveries, stop func()) {
	t.Helper()
	sub, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: *cfg})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	d = &deliveries{got: map[int][]int64{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			p, _ := strconv.Atoi(m.Metadata.Get(kafkapubsub.MetadataPartition))
			off, _ := strconv.ParseInt(m.Metadata.Get(kafkapubsub.MetadataOffset), 10, 64)
			d.mu.Lock()
			d.got[p] = append(d.got[p], off)
			d.mu.Unlock()
			m.Ack()
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { _ = sub.Close(); <-done }) }
	t.Cleanup(stop)
	return d, stop
}

func offsetRange(from, to int64) []int64 {
	var out []int64
	for o := from; o < to; o++ {
		out = append(out, o)
	}
	return out
}

// The same contract as kafkapubsub's TestPositions, on kgopubsub's
// Subscriber. With Positions, each commit saves the positions in the database, and a
// partition starts at the earlier of Kafka's committed offset and the
// database's position: a database that lost commits gets what it lost
// again, also under a running member; a group unknown to Kafka starts at
// the database's position; a failed save commits nothing to Kafka either.
func TestPositions(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions = 2
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	produceKeyed(t, brokers, topic, 40, 8)
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
			Logger: quietLogger()}
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
	_, stop := consumeAll(t, cfg(group), topic)
	waitCommitted(t, group, topic, partitions, 60*time.Second)
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
	d, stop := consumeAll(t, cfg(group), topic)
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
	d, stop = consumeAll(t, cfg(group), topic)
	produceKeyed(t, brokers, topic, 16, 8)
	mid := kafkatest.EndOffsets(t, topic, partitions)
	testenv.WaitFor(t, 60*time.Second, "the running member to save the new records' positions", func() bool {
		return maps.Equal(load(group), mid)
	})
	lost = mid[0] - 3
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: lost}, nil); err != nil {
		t.Fatal(err)
	}
	produceKeyed(t, brokers, topic, 16, 8)
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
	waitCommitted(t, group, topic, partitions, 60*time.Second)
	end = last

	// A group Kafka does not know (its offsets expired, say) starts at the
	// database's positions, not at StartOffset.
	other := kafkatest.Name("g")
	if _, err := positions.Save(ctx, other, topic, map[int]int64{0: end[0] - 2, 1: end[1] - 1}, nil); err != nil {
		t.Fatal(err)
	}
	d, stop = consumeAll(t, cfg(other), topic)
	waitCommitted(t, other, topic, partitions, 60*time.Second)
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
	d, stop = consumeAll(t, cfg(third), topic)
	testenv.WaitFor(t, 60*time.Second, "every record to be delivered", func() bool {
		return int64(len(d.of(0))) == end[0] && int64(len(d.of(1))) == end[1]
	})
	stop()
	if after := kafkatest.CommittedOffsets(t, third, topic, partitions); !maps.Equal(after, before) {
		t.Fatalf("Kafka's committed offsets went from %v to %v while no position could be saved", before, after)
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Positions need a consumer group.
func TestPositionsNeedAGroup(t *testing.T) {
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	_, err = kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, Positions: store.Positions()}})
	if err == nil {
		t.Fatal("a Subscriber with Positions and no ConsumerGroup was accepted")
	}
}

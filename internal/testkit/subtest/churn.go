package subtest

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// Members with claimed positions join and leave while records flow: no
// healthy rebalance makes a legitimate owner's claim lose to another's, so
// every partition's position (in the database and in Kafka) reaches the
// end once the last member has consumed, and every record was delivered.
func PositionsChurn(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions = 6
	topic, group := kafkatest.Topic(t, partitions), kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	ids := []int{0, 1, 2, 3, 4, 5}
	sum := func() int64 {
		t.Helper()
		got, err := positions.Load(ctx, group, topic, ids)
		if err != nil {
			t.Fatal(err)
		}
		var s int64
		for _, p := range got {
			s += p
		}
		return s
	}
	cfg := func() *kafkapubsub.SubscriberConfig {
		return &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: Logger()}
	}
	// Records flow the whole time the members come and go.
	quit, produced := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(produced)
		for {
			select {
			case <-quit:
				return
			default:
			}
			ProduceKeyed(t, brokers, topic, 24, 12)
			time.Sleep(50 * time.Millisecond) // pacing of the producer, not a wait for a condition
		}
	}()
	var all []*deliveries
	progress := func(what string) {
		t.Helper()
		from := sum()
		testenv.WaitFor(t, 90*time.Second, fmt.Sprintf("positions to advance past %d (%s)", from+50, what), func() bool { return sum() > from+50 })
	}
	dA, stopA := consumeAll(t, tr, cfg(), topic)
	all = append(all, dA)
	progress("A alone")
	dB, stopB := consumeAll(t, tr, cfg(), topic)
	all = append(all, dB)
	testenv.WaitFor(t, 90*time.Second, "B to be assigned and deliver", func() bool {
		return len(dB.of(0))+len(dB.of(1))+len(dB.of(2))+len(dB.of(3))+len(dB.of(4))+len(dB.of(5)) > 0
	})
	progress("A and B")
	dC, stopC := consumeAll(t, tr, cfg(), topic)
	all = append(all, dC)
	testenv.WaitFor(t, 90*time.Second, "C to be assigned and deliver", func() bool {
		return len(dC.of(0))+len(dC.of(1))+len(dC.of(2))+len(dC.of(3))+len(dC.of(4))+len(dC.of(5)) > 0
	})
	progress("A, B and C")
	stopA()
	progress("B and C")
	dA2, stopA2 := consumeAll(t, tr, cfg(), topic)
	all = append(all, dA2)
	progress("B, C and A again")
	stopB()
	progress("C and A again")
	close(quit)
	<-produced
	end := kafkatest.EndOffsets(t, topic, partitions)
	maps.DeleteFunc(end, func(_ int, o int64) bool { return o == 0 })
	testenv.WaitFor(t, 90*time.Second, "every partition's position to reach the end", func() bool {
		got, err := positions.Load(ctx, group, topic, ids)
		if err != nil {
			t.Fatal(err)
		}
		return maps.Equal(got, end)
	})
	WaitCommitted(t, group, topic, partitions, 60*time.Second)
	stopC()
	stopA2()
	for p := range partitions {
		seen := map[int64]bool{}
		for _, d := range all {
			for _, o := range d.of(p) {
				seen[o] = true
			}
		}
		for o := int64(0); o < end[p]; o++ {
			if !seen[o] {
				t.Errorf("partition %d: offset %d never delivered", p, o)
			}
		}
	}
}

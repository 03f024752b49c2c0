package kgopubsub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// A rebalance drains every message of a revoked partition's window: four
// messages of each of two partitions are with the handler when a second
// member joins (one partition moves to it), their handlers
// end only after the group is rebalancing, and longer than SessionTimeout
// after; the first member keeps its membership through the drain, commits,
// and none of them is delivered again.
func TestRebalanceDrainsWholeWindow(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n, window = 2, 40, 4
	const session = 6 * time.Second
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	subtest.ProduceKeyed(t, brokers, topic, n, 10)
	cfg := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, SessionTimeout: session,
		HeartbeatInterval: 500 * time.Millisecond, RebalanceTimeout: time.Minute, DrainTimeout: 40 * time.Second,
	}}
	var mu sync.Mutex
	deliveries := map[[2]int64]int{}
	second := 0 // deliveries to the member that joined
	release := make(chan struct{})
	consume := func(ch <-chan *message.Message, joined bool) {
		for m := range ch {
			go func() {
				off := [2]int64{int64(subtest.PartitionOf(m)), subtest.OffsetOf(m)}
				mu.Lock()
				deliveries[off]++
				if joined {
					second++
				}
				first := len(deliveries) <= partitions*window && deliveries[off] == 1
				mu.Unlock()
				if first {
					<-release
					time.Sleep(session + session/2)
				}
				m.Ack()
			}()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chA, err := subscriber(t, cfg).Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chA, false)
	testenv.WaitFor(t, time.Minute, "a full window of each partition with the handler", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == partitions*window
	})
	chB, err := subscriber(t, cfg).Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chB, true)
	adm := admin(t)
	testenv.WaitFor(t, time.Minute, "the group to rebalance", func() bool {
		ds, err := adm.DescribeGroups(ctx, group)
		return err == nil && ds[group].State == "PreparingRebalance"
	})
	close(release)
	subtest.WaitCommitted(t, group, topic, partitions, 2*time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if second == 0 {
		t.Fatal("no partition moved to the member that joined")
	}
	for off, d := range deliveries {
		if d != 1 {
			t.Errorf("partition %d offset %d delivered %d times", off[0], off[1], d)
		}
	}
	if len(deliveries) != n {
		t.Errorf("%d offsets delivered, want %d", len(deliveries), n)
	}
}

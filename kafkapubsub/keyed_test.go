package kafkapubsub_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// A negative MaxInFlight is refused, naming the field and the fix; zero is
// the default, one message per partition.
func TestMaxInFlightValidated(t *testing.T) {
	_, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, MaxInFlight: -1})
	if err == nil || !strings.Contains(err.Error(), "MaxInFlight") {
		t.Fatalf("got %v, want an error naming MaxInFlight", err)
	}
	if _, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, KeyOrdered: true}); err != nil {
		t.Fatal(err)
	}
}

// A rebalance drains every message of a revoked partition's window, not
// only one: four messages are with the handler when a second member joins,
// their handlers end only after the group is rebalancing, and none of them
// is delivered again.
func TestRebalanceDrainsWholeWindow(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const n, window = 20, 4
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	subtest.ProduceKeyed(t, brokers, topic, n, 5)
	newSub := func() *kafkapubsub.Subscriber {
		sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
			Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, SessionTimeout: 6 * time.Second,
			HeartbeatInterval: 500 * time.Millisecond, RebalanceTimeout: time.Minute, DrainTimeout: 40 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	var mu sync.Mutex
	deliveries := map[string]int{}
	release := make(chan struct{})
	consume := func(ch <-chan *message.Message) {
		for m := range ch {
			go func() {
				off := m.Metadata.Get(kafkapubsub.MetadataOffset)
				mu.Lock()
				deliveries[off]++
				first := len(deliveries) <= window && deliveries[off] == 1
				mu.Unlock()
				if first {
					<-release
					// The handler's work outlasts the heartbeat interval, so
					// the member learns of the rebalance while the window is
					// with the handler.
					time.Sleep(3 * time.Second)
				}
				m.Ack()
			}()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chA, err := newSub().Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chA)
	testenv.WaitFor(t, time.Minute, "a full window with the handler", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == window
	})
	chB, err := newSub().Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chB)
	c := kafkatest.Client(t)
	testenv.WaitFor(t, time.Minute, "the group to rebalance", func() bool {
		res, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		return err == nil && len(res.Groups) == 1 && res.Groups[0].GroupState == "PreparingRebalance"
	})
	close(release)
	subtest.WaitCommitted(t, group, topic, 1, 2*time.Minute)
	mu.Lock()
	defer mu.Unlock()
	for off, d := range deliveries {
		if d != 1 {
			t.Errorf("offset %s delivered %d times", off, d)
		}
	}
	if len(deliveries) != n {
		t.Errorf("%d offsets delivered, want %d", len(deliveries), n)
	}
}

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
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// A handler slower than the session timeout is in flight when a second
// member joins: the first member drains it for longer than SessionTimeout,
// keeps its membership through the drain, commits, and the message is not
// delivered again to anyone.
func TestSlowDrainKeepsMembership(t *testing.T) {
	brokers := kafkatest.RealParallel(t)
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	const n = 5
	var msgs []kafka.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte{byte('a' + i)}})
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	_ = wr.Close()

	const session = 6 * time.Second
	newSub := func() *kafkapubsub.Subscriber {
		sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
			Brokers: brokers, ConsumerGroup: group, SessionTimeout: session, HeartbeatInterval: time.Second,
			RebalanceTimeout: time.Minute, DrainTimeout: 40 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	var mu sync.Mutex
	deliveries := map[string]int{} // offset → deliveries
	joined := make(chan struct{})
	consume := func(ch <-chan *message.Message, slowFirst bool) {
		for m := range ch {
			mu.Lock()
			off := m.Metadata.Get(kafkapubsub.MetadataOffset)
			deliveries[off]++
			first := len(deliveries) == 1 && deliveries[off] == 1
			mu.Unlock()
			if slowFirst && first {
				<-joined
				// The handler's work outlasts the session timeout, all of it
				// during the rebalance that the second member started.
				time.Sleep(2*session + session/2)
			}
			m.Ack()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newSub()
	chA, err := a.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chA, true)
	testenv.WaitFor(t, time.Minute, "the first delivery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == 1
	})
	b := newSub()
	chB, err := b.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chB, false)
	close(joined)
	testenv.WaitFor(t, 2*time.Minute, "the group to commit every record", func() bool {
		return kafkatest.CommittedOffsets(t, group, topic, 1)[0] == n
	})
	mu.Lock()
	defer mu.Unlock()
	var redelivered []string
	for off, c := range deliveries {
		if c != 1 {
			redelivered = append(redelivered, off)
		}
	}
	if len(redelivered) > 0 || len(deliveries) != n {
		t.Fatalf("deliveries per offset %v: offsets %s delivered more than once", deliveries, strings.Join(redelivered, ","))
	}
}

// A DrainTimeout the group cannot wait for is refused at construction, with
// the field and the fix named.
func TestDrainTimeoutMustBeBelowRebalanceTimeout(t *testing.T) {
	_, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, ConsumerGroup: "g",
		RebalanceTimeout: 10 * time.Second, DrainTimeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "DrainTimeout") || !strings.Contains(err.Error(), "RebalanceTimeout") {
		t.Fatalf("got %v, want an error naming DrainTimeout and RebalanceTimeout", err)
	}
	// Only RebalanceTimeout set: the default DrainTimeout fits below it.
	if _, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, RebalanceTimeout: 4 * time.Second}); err != nil {
		t.Fatal(err)
	}
}

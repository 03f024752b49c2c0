package kgopubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Two running members with one InstanceID (a misconfiguration: the same
// pod name in every replica): the broker fences the first when the second
// joins, and refuses its every join and commit from then on. The fenced
// member's subscription ends (its worker stops, instead of idling as if
// healthy), and the other member consumes every record.
func TestDuplicateInstanceIDEndsTheFencedSubscription(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(t, 4), kafkatest.Name("g")
	cfg := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group}, InstanceID: "pod"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca, cb := &counter{got: map[[2]int64]int{}}, &counter{got: map[[2]int64]int{}}
	first := subscriber(t, cfg)
	cha, err := first.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { consume(cha, ca, 0); close(ended) }()
	subtest.ProduceKeyed(t, brokers, topic, 100, 10)
	subtest.WaitCommitted(t, group, topic, 4, time.Minute)
	second := subscriber(t, cfg)
	chb, err := second.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chb, cb, 0)
	subtest.ProduceKeyed(t, brokers, topic, 100, 10)
	testenv.WaitFor(t, time.Minute, "the fenced member's subscription to end", func() bool {
		select {
		case <-ended:
			return true
		default:
			return false
		}
	})
	subtest.ProduceKeyed(t, brokers, topic, 100, 10)
	subtest.WaitCommitted(t, group, topic, 4, time.Minute)
	ca.mu.Lock()
	cb.mu.Lock()
	defer ca.mu.Unlock()
	defer cb.mu.Unlock()
	for off := range ca.got {
		cb.got[off]++
	}
	if len(cb.got) != 300 {
		t.Fatalf("%d distinct records delivered, want 300", len(cb.got))
	}
}

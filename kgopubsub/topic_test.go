package kgopubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// A Subscriber started before its topic exists consumes once the topic is
// created.
func TestSubscribeBeforeTopicExists(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Name("late")
	group := kafkatest.Name("g")
	sub := subscriber(t, kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group}})
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the member joins (or waits) before the topic exists
	kafkatest.CreateTopic(t, topic, 1)
	pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quietLogger()}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, message.NewMessage("", []byte("one")), message.NewMessage("", []byte("two"))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"one", "two"} {
		select {
		case m := <-ch:
			if string(m.Payload) != want {
				t.Fatalf("got %q, want %q", m.Payload, want)
			}
			m.Ack()
		case <-time.After(time.Minute):
			t.Fatalf("%q not delivered in a minute after the topic was created", want)
		}
	}
	subtest.WaitCommitted(t, group, topic, 1, time.Minute)
}

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

// transport is what a caller that configures kafkapubsub takes to run on
// franz-go instead.
type transport interface {
	NewSubscriber(*kafkapubsub.SubscriberConfig) (message.Subscriber, error)
	NewPublisher(*kafkapubsub.PublisherConfig) (message.Publisher, error)
}

// A Transport turns kafkapubsub's configurations into a working franz-go
// Pub/Sub: a message published through it is consumed through it, with its
// key, and the group commits it.
func TestTransport(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	group := kafkatest.Name("g")
	var tr transport = kgopubsub.Transport{InstanceID: group + "-0"}
	pub, err := tr.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	m := message.NewMessage("", []byte("payload"))
	m.Metadata.Set(kafkapubsub.MetadataKafkaKey, "key-1")
	if err := pub.Publish(topic, m); err != nil {
		t.Fatal(err)
	}
	sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		if got.UUID != m.UUID || string(got.Payload) != "payload" || got.Metadata.Get(kafkapubsub.MetadataKafkaKey) != "key-1" {
			t.Fatalf("got %s %q %v, want %s %q with key key-1", got.UUID, got.Payload, got.Metadata, m.UUID, "payload")
		}
		got.Ack()
	case <-time.After(time.Minute):
		t.Fatal("nothing consumed in a minute")
	}
	subtest.WaitCommitted(t, group, topic, 2, time.Minute)
}

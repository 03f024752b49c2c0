package kgopubsub_test

import (
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pubsubtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

func quietLogger() *slog.Logger { return pubsubtest.QuietLogger() }

func newPubSubOn(t *testing.T, brokers []string, group string) (message.Publisher, message.Subscriber) {
	pc, sc := pubsubtest.Configs(brokers, group)
	pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: pc})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: sc})
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

func newPubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	return newPubSubOn(t, kafkatest.Brokers(t), group)
}

// TestPubSub runs Watermill's universal Pub/Sub test suite
// (pubsubtest.Suite) with the features kafkapubsub's run declares. Its
// TestReconnect restarts a broker of its own; it races on the suite's own
// slice, so under the race detector it skips (as kafkapubsub's does).
func TestPubSub(t *testing.T) {
	kafkatest.RequireReal(t)
	pubsubtest.Suite(t, raceDetector, "./kgopubsub/", newPubSubOn)
}

func subscriber(t *testing.T, cfg kgopubsub.SubscriberConfig) *kgopubsub.Subscriber {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	sub, err := kgopubsub.NewSubscriber(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// publish publishes msgs to topic with a Publisher of its own.
func publish(t *testing.T, topic string, msgs ...*message.Message) {
	t.Helper()
	pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: kafkatest.Brokers(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

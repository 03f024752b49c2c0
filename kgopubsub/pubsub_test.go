package kgopubsub_test

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

func quietLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func newPubSubOn(t *testing.T, brokers []string, group string) (message.Publisher, message.Subscriber) {
	pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{
		Brokers:                brokers,
		AllowAutoTopicCreation: true,
		// Messages of one kind share a key, so they share a partition and keep their order.
		PartitionKeyFunc: func(_ string, m *message.Message) (string, error) { return string(m.Payload), nil },
		Logger:           quietLogger(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers:          brokers,
		ConsumerGroup:    group,
		NackBackoff:      10 * time.Millisecond,
		MaxNackBackoff:   10 * time.Millisecond,
		SessionTimeout:   6 * time.Second,
		RebalanceTimeout: 10 * time.Second,
		DrainTimeout:     5 * time.Second,
		Logger:           quietLogger(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

func newPubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	return newPubSubOn(t, kafkatest.Brokers(t), group)
}

// TestPubSub runs Watermill's universal Pub/Sub test suite with the
// features kafkapubsub's run declares. Its TestReconnect restarts a broker
// of its own; it races on the suite's own slice, so under the race
// detector it skips (as kafkapubsub's does).
func TestPubSub(t *testing.T) {
	kafkatest.RequireReal(t)
	own := kafkatest.PrepareOwn(t, nil)
	var started sync.Once
	features := tests.Features{
		ConsumerGroups:                   true,
		ExactlyOnceDelivery:              false,
		GuaranteedOrder:                  true,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: true,
		RestartServiceCommand:            own.Restart,
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
			if strings.Contains(name, "TestNewSubscriberReceivesOldMessages") {
				name = kafkatest.Name(name)
			}
			if strings.Contains(name, "TestReconnect") {
				if raceDetector {
					t.Skip("Watermill's TestReconnect races on its own slice of published messages: run it without -race")
				}
				started.Do(func() { own.Start(t) })
				return newPubSubOn(t, []string{own.Addr}, "ps-"+name)
			}
			return newPubSub(t, "ps-"+name)
		},
		newPubSub,
	)
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

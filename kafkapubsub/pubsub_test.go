package kafkapubsub_test

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

func quietLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func newPubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	brokers := kafkatest.Brokers(t)
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{
		Brokers:                brokers,
		AllowAutoTopicCreation: true,
		// Messages of one kind share a key, so they share a partition and keep their order.
		PartitionKeyFunc: func(_ string, m *message.Message) (string, error) { return string(m.Payload), nil },
		Logger:           quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers:          brokers,
		ConsumerGroup:    group,
		NackBackoff:      10 * time.Millisecond,
		MaxNackBackoff:   10 * time.Millisecond,
		SessionTimeout:   6 * time.Second,
		RebalanceTimeout: 10 * time.Second,
		DrainTimeout:     5 * time.Second,
		Logger:           quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// TestPubSub runs Watermill's universal Pub/Sub test suite.
func TestPubSub(t *testing.T) {
	kafkatest.Brokers(t)
	features := tests.Features{
		ConsumerGroups:                   true,
		ExactlyOnceDelivery:              false,
		GuaranteedOrder:                  true,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: true,
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) {
			// Subscribers made for one test share a group, so several of
			// them split the partitions instead of each reading everything.
			// In Kafka a new subscriber sees old messages only in a new
			// group: that test gets one group per subscriber.
			name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
			if strings.Contains(name, "TestNewSubscriberReceivesOldMessages") {
				name = kafkatest.Name(name)
			}
			return newPubSub(t, "ps-"+name)
		},
		newPubSub,
	)
}

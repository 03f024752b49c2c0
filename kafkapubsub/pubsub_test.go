package kafkapubsub_test

import (
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pubsubtest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

func quietLogger() *slog.Logger { return pubsubtest.QuietLogger() }

func newPubSub(t *testing.T, group string) (message.Publisher, message.Subscriber) {
	return newPubSubOn(t, kafkatest.Brokers(t), group)
}

func newPubSubOn(t *testing.T, brokers []string, group string) (message.Publisher, message.Subscriber) {
	pc, sc := pubsubtest.Configs(brokers, group)
	pub, err := kafkapubsub.NewPublisher(&pc)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&sc)
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// TestPubSub runs Watermill's universal Pub/Sub test suite
// (pubsubtest.Suite: its TestReconnect skips under the race detector, and
// make test runs it without).
func TestPubSub(t *testing.T) {
	kafkatest.Brokers(t)
	pubsubtest.Suite(t, raceDetector, "./kafkapubsub/", newPubSubOn)
}

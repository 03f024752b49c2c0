package kafkapubsub_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// A message published with no UUID gets a UUIDv7, in the record's header
// and in the message, so publishing it again sends the same ID.
func TestPublishMintsUUIDv7(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	minted, given := message.NewMessage("", []byte("a")), message.NewMessage("given", []byte("b"))
	if err := pub.Publish(topic, minted, given); err != nil {
		t.Fatal(err)
	}
	first := minted.UUID
	if p, err := dedupe.ParseTimeID(first); err != nil || p.Kind != dedupe.UUIDv7 {
		t.Fatalf("minted UUID %q: %v; want a UUIDv7", first, err)
	}
	if err := pub.Publish(topic, minted); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range kafkatest.ReadAll(t, topic, 1, 30*time.Second) {
		for _, h := range r.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				got = append(got, string(h.Value))
			}
		}
	}
	if len(got) != 3 || got[0] != first || got[1] != "given" || got[2] != first {
		t.Fatalf("UUID headers %q, want [%s given %s]", got, first, first)
	}
}

package kafkapubsub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// CreateTopics creates what is missing, accepts what exists (keeping its
// partitions), and names each topic it could not create.
func TestCreateTopics(t *testing.T) {
	kafkatest.RequireReal(t)
	brokers := kafkatest.Brokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	existing := kafkatest.Topic(t, 2)
	fresh := kafkatest.Name("fresh")
	t.Cleanup(func() { deleteTopics(t, fresh) })
	err := kafkapubsub.CreateTopics(ctx, brokers, kafkapubsub.Security{},
		kafkapubsub.TopicSpec{Name: existing, Partitions: 5},
		kafkapubsub.TopicSpec{Name: fresh, Partitions: 3, Config: map[string]string{"retention.ms": "3600000"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(kafkatest.EndOffsets(t, existing, 2)); n != 2 {
		t.Fatalf("the existing topic has %d partitions, want its 2", n)
	}
	// Every partition of the new topic has a leader when CreateTopics returns.
	if n := len(kafkatest.EndOffsets(t, fresh, 3)); n != 3 {
		t.Fatalf("the new topic has %d partitions, want 3", n)
	}
	if err := kafkapubsub.CheckTTL(ctx, brokers, kafkapubsub.Security{}, fresh, 2*time.Hour); err != nil {
		t.Fatalf("the new topic's retention.ms was not set: %v", err)
	}

	bad := "bad name!"
	other := kafkatest.Name("other")
	t.Cleanup(func() { deleteTopics(t, other) })
	err = kafkapubsub.CreateTopics(ctx, brokers, kafkapubsub.Security{},
		kafkapubsub.TopicSpec{Name: bad}, kafkapubsub.TopicSpec{Name: other, Partitions: 1})
	if err == nil || !strings.Contains(err.Error(), "create topic "+bad) || strings.Contains(err.Error(), other) {
		t.Fatalf("CreateTopics with an invalid name returned %v, want an error naming %q alone", err, bad)
	}
}

func deleteTopics(t *testing.T, topics ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = kafkatest.Client(t).DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
}

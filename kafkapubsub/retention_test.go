package kafkapubsub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

func TestCheckTTL(t *testing.T) {
	brokers := kafkatest.RealParallel(t)
	ctx := context.Background()
	topic := kafkatest.Name("retention")
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "3600000"}}}}})
	if err != nil || res.Errors[topic] != nil {
		t.Fatal(err, res.Errors[topic])
	}
	t.Cleanup(func() {
		_, _ = c.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
	if err := kafkapubsub.CheckTTL(ctx, brokers, kafkapubsub.Security{}, topic, dedupe.DefaultTTL); err != nil {
		t.Fatalf("7-day TTL on a 1-hour topic: %v", err)
	}
	err = kafkapubsub.CheckTTL(ctx, brokers, kafkapubsub.Security{}, topic, time.Minute)
	if !errors.Is(err, kafkapubsub.ErrTTLTooShort) {
		t.Fatalf("1-minute TTL on a 1-hour topic: %v, want ErrTTLTooShort", err)
	}
	if err := kafkapubsub.CheckTTL(ctx, brokers, kafkapubsub.Security{}, kafkatest.Name("missing"), time.Hour); err == nil || errors.Is(err, kafkapubsub.ErrTTLTooShort) {
		t.Fatalf("unknown topic: %v", err)
	}
}

package kgopubsub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// A command over franz-go's default batch size (about 1 MB, which it checks
// on the uncompressed record) that the topic takes is copied before its
// last delivery like any other, and comes back after its last delivery
// failed: 1.02 MB on a topic of Kafka's default max.message.bytes, 1.5 MB
// on one that takes 4 MB, and 1.5 MB compressed by its producer (zstd)
// below the default topic's limit.
func TestShareLargeRecordCopied(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		size       int
		maxBytes   string
		compressed bool
	}{{"1.02MB default topic", 1_020_000, "", false}, {"1.5MB topic of 4MB", 1_500_000, "4194304", false},
		{"1.5MB zstd default topic", 1_500_000, "", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			requireShareGroups(t)
			topic, group := kafkatest.Name("large"), kafkatest.Name("sg")
			codec := kgo.NoCompression()
			if c.compressed {
				codec = kgo.ZstdCompression()
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...), kgo.DefaultProduceTopic(topic),
				kgo.ProducerBatchMaxBytes(8<<20), kgo.ProducerBatchCompression(codec))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			conf := map[string]*string{}
			if c.maxBytes != "" {
				conf["max.message.bytes"] = &c.maxBytes
			}
			if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, conf, topic); err != nil {
				t.Fatal(err)
			}
			setShareGroup(t, group, map[string]string{"share.record.lock.duration.ms": "1000", "share.delivery.count.limit": "2"})
			sub, err := kgopubsub.NewShareSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
				Brokers: kafkatest.Brokers(t), ConsumerGroup: group, Logger: quietLogger(), NackBackoff: 300 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ch, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			value := []byte(strings.Repeat("x", c.size))
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: value,
				Headers: []kgo.RecordHeader{{Key: kafkapubsub.UUIDHeader, Value: []byte(uuid.NewString())}}}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			var seen []string
			for msg := range ch {
				seen = append(seen, msg.Metadata.Get(kafkapubsub.MetadataOffset)+"/"+msg.Metadata.Get(kgopubsub.MetadataDeliveryCount))
				if len(msg.Payload) != c.size {
					t.Fatalf("delivered %d bytes, want %d", len(msg.Payload), c.size)
				}
				if msg.Metadata.Get(kafkapubsub.MetadataOffset) == "0" {
					msg.Nack() // fails on every delivery of the record
					continue
				}
				msg.Ack()
				cancel()
			}
			if ctx.Err() != context.Canceled {
				t.Fatalf("the command never came back after its last delivery failed: lost (deliveries: offset/count %v; the topic's end: %d)",
					seen, kafkatest.EndOffsets(t, topic, 1)[0])
			}
		})
	}
}

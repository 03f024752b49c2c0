package kgopubsub_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// With each Partitioner, a key published through kgopubsub's Publisher
// lands on the partition where kafkapubsub's Publisher puts it.
func TestPartitionersMatchKafkapubsub(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, keys = 6, 120
	for _, name := range kafkapubsub.Partitioners {
		t.Run(string(name), func(t *testing.T) {
			topic := kafkatest.Topic(t, partitions)
			cfg := kafkapubsub.PublisherConfig{Brokers: brokers, Partitioner: name, Logger: quietLogger()}
			kp, err := kafkapubsub.NewPublisher(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer kp.Close()
			gp, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: cfg})
			if err != nil {
				t.Fatal(err)
			}
			defer gp.Close()
			for via, pub := range map[string]message.Publisher{"kafka-go": kp, "franz-go": gp} {
				var msgs []*message.Message
				for k := 0; k < keys; k++ {
					m := message.NewMessage("", []byte(via))
					m.Metadata.Set(kafkapubsub.MetadataKafkaKey, fmt.Sprintf("key-%d", k))
					msgs = append(msgs, m)
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					t.Fatal(err)
				}
			}
			where := map[string]map[string]int{"kafka-go": {}, "franz-go": {}}
			used := map[int]bool{}
			for _, r := range kafkatest.ReadAll(t, topic, partitions, time.Minute) {
				where[string(r.Value)][string(r.Key)] = r.Partition
				used[r.Partition] = true
			}
			if len(where["kafka-go"]) != keys || len(where["franz-go"]) != keys {
				t.Fatalf("read %d keys from kafka-go's records and %d from franz-go's, want %d each", len(where["kafka-go"]), len(where["franz-go"]), keys)
			}
			for k, p := range where["kafka-go"] {
				if q := where["franz-go"][k]; q != p {
					t.Errorf("%s: key %s on partition %d through kafkapubsub, %d through kgopubsub", name, k, p, q)
				}
			}
			if len(used) < partitions {
				t.Fatalf("%d keys used %d of %d partitions", keys, len(used), partitions)
			}
		})
	}
}

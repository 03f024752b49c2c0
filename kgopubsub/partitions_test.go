package kgopubsub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Partitions added to a subscribed topic are consumed within seconds, as
// on kafkapubsub (kafka-go's group watches the partition count every 5s),
// not at the client's next periodic metadata refresh (5 minutes by
// default), which left their records unconsumed that long.
func TestNewPartitionsConsumed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		protocol kgopubsub.GroupProtocol
		instance string
	}{{"cooperative", kgopubsub.ProtocolClassic, ""}, {"static", kgopubsub.ProtocolClassic, "member-0"}, {"kip848", kgopubsub.ProtocolConsumer, ""}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.protocol == kgopubsub.ProtocolConsumer {
				requireKIP848(t)
			}
			newPartitionsConsumed(t, c.protocol, c.instance)
		})
	}
}

func newPartitionsConsumed(t *testing.T, protocol kgopubsub.GroupProtocol, instance string) {
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(t, 2), kafkatest.Name("g")
	sub := subscriber(t, kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group},
		GroupProtocol: protocol, InstanceID: instance})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			m.Ack()
		}
	}()
	subtest.ProduceKeyed(t, brokers, topic, 40, 8)
	subtest.WaitCommitted(t, group, topic, 2, time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	// Records on the new partitions 2 and 3.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	for p := int32(2); p < 4; p++ {
		// The producer may not know of the new partitions yet: its
		// metadata is refreshed until it does.
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := pcl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("new")}).FirstErr()
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "invalid record partitioning choice") || time.Now().After(deadline) {
				t.Fatal(err)
			}
			pcl.ForceMetadataRefresh()
			time.Sleep(200 * time.Millisecond)
		}
	}
	subtest.WaitCommitted(t, group, topic, 4, time.Minute)
}

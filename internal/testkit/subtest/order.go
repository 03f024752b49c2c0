package subtest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Messages of a partition are delivered in offset order, one at a time by
// default (MaxInFlight 1: the next only once the last is acked), each
// carrying its Kafka coordinates in its context (as the
// dedupe middleware reads them) and in its metadata.
func OrderAndCoordinates(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n = 3, 300
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	ProduceKeyed(t, brokers, topic, n, 30)
	sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]int64{}
	// unacked holds the partitions with a message delivered and not yet
	// acked; queue, the messages delivered while another was in hand.
	unacked := map[int]bool{}
	var queue []*message.Message
	take := func(m *message.Message) {
		if unacked[PartitionOf(m)] {
			t.Fatalf("partition %d: offset %d delivered while another of its messages was unacked, with MaxInFlight 1", PartitionOf(m), OffsetOf(m))
		}
		unacked[PartitionOf(m)] = true
		queue = append(queue, m)
	}
	for got := 0; got < n; got++ {
		if len(queue) == 0 {
			select {
			case m := <-ch:
				take(m)
			case <-time.After(time.Minute):
				t.Fatalf("%d of %d messages in a minute", got, n)
			}
		}
		m := queue[0]
		queue = queue[1:]
		// Whatever else comes while m is in hand must be of another
		// partition.
		for wait := time.After(2 * time.Millisecond); ; {
			select {
			case o := <-ch:
				take(o)
				continue
			case <-wait:
			}
			break
		}
		src, ok := dedupe.SourceFromContext(m.Context())
		if !ok || src.Topic != topic || int(src.Partition) != PartitionOf(m) || src.Offset != OffsetOf(m) {
			t.Fatalf("context source %+v (ok %v), metadata %v", src, ok, m.Metadata)
		}
		if l, ok := last[PartitionOf(m)]; ok && OffsetOf(m) != l+1 {
			t.Fatalf("partition %d: offset %d after %d", PartitionOf(m), OffsetOf(m), l)
		}
		last[PartitionOf(m)] = OffsetOf(m)
		if m.Metadata.Get(kafkapubsub.MetadataKafkaKey) == "" || m.Metadata.Get(kafkapubsub.MetadataTimestamp) == "" {
			t.Fatalf("metadata %v lacks the key or the timestamp", m.Metadata)
		}
		unacked[PartitionOf(m)] = false
		m.Ack()
	}
	WaitCommitted(t, group, topic, partitions, time.Minute)
}

// OffsetOf is the Kafka offset in m's metadata.
func OffsetOf(m *message.Message) int64 {
	o, _ := strconv.ParseInt(m.Metadata.Get(kafkapubsub.MetadataOffset), 10, 64)
	return o
}

// PartitionOf is the Kafka partition in m's metadata.
func PartitionOf(m *message.Message) int {
	p, _ := strconv.Atoi(m.Metadata.Get(kafkapubsub.MetadataPartition))
	return p
}

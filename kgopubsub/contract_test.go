package kgopubsub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/subtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// counter counts deliveries per partition and offset.
type counter struct {
	mu  sync.Mutex
	got map[[2]int64]int
	n   int
}

func (c *counter) add(m *message.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[[2]int64{int64(subtest.PartitionOf(m)), subtest.OffsetOf(m)}]++
	c.n++
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// consume acks every message of ch, counting it, after pause.
func consume(ch <-chan *message.Message, c *counter, pause time.Duration) {
	for m := range ch {
		c.add(m)
		time.Sleep(pause)
		m.Ack()
	}
}

// rebalanceWithoutLossOrDup runs one member on topic, starts a second one
// in the same group mid-way, and checks by offsets that every record was
// delivered exactly once across both and that the group committed them
// all: a revoked partition commits what it acked before its next owner
// starts.
func rebalanceWithoutLossOrDup(t *testing.T, protocol kgopubsub.GroupProtocol) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n = 4, 2000
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	subtest.ProduceKeyed(t, brokers, topic, n, 64)
	cfg := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout: 20 * time.Second, DrainTimeout: 10 * time.Second,
	}, GroupProtocol: protocol}
	c := &counter{got: map[[2]int64]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := subscriber(t, cfg)
	chA, err := a.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	go consume(chA, c, 5*time.Millisecond)
	testenv.WaitFor(t, time.Minute, "the first member to consume a part", func() bool { return c.total() >= n/5 })
	b := subscriber(t, cfg)
	chB, err := b.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	cb := &counter{got: map[[2]int64]int{}}
	go consume(chB, cb, 5*time.Millisecond)
	testenv.WaitFor(t, time.Minute, "the second member to be given records", func() bool { return cb.total() > 0 })
	checkProtocol(t, group, protocol, 2)
	subtest.WaitCommitted(t, group, topic, partitions, 2*time.Minute)
	c.mu.Lock()
	cb.mu.Lock()
	defer c.mu.Unlock()
	defer cb.mu.Unlock()
	if len(cb.got) == 0 {
		t.Fatal("the second member was given nothing: no rebalance happened")
	}
	end := kafkatest.EndOffsets(t, topic, partitions)
	for p := 0; p < partitions; p++ {
		for o := int64(0); o < end[p]; o++ {
			k := [2]int64{int64(p), o}
			if d := c.got[k] + cb.got[k]; d != 1 {
				t.Errorf("partition %d offset %d delivered %d times (first member %d, second %d)", p, o, d, c.got[k], cb.got[k])
			}
		}
	}
}

// A second member joining moves partitions without losing or doubling a
// record, on the classic protocol (cooperative-sticky)...
func TestRebalanceWithoutLossOrDuplicate(t *testing.T) {
	rebalanceWithoutLossOrDup(t, kgopubsub.ProtocolClassic)
}

// ...and on KIP-848's (the broker assigns).
func TestRebalanceWithoutLossOrDuplicateKIP848(t *testing.T) {
	requireKIP848(t)
	rebalanceWithoutLossOrDup(t, kgopubsub.ProtocolConsumer)
}

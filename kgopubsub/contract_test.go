package kgopubsub_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Messages of a partition are delivered in offset order, one at a time by
// default, each carrying its Kafka coordinates in its context (as the
// dedupe middleware reads them) and in its metadata.
func TestOrderAndCoordinates(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n = 3, 300
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	produceKeyed(t, brokers, topic, n, 30)
	sub := subscriber(t, kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group}})
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]int64{}
	inFlight := false
	for got := 0; got < n; got++ {
		var m *message.Message
		select {
		case m = <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d messages in a minute", got, n)
		}
		if inFlight {
			t.Fatal("two messages delivered at once with MaxInFlight 1")
		}
		src, ok := dedupe.SourceFromContext(m.Context())
		if !ok || src.Topic != topic || int(src.Partition) != partitionOf(m) || src.Offset != offsetOf(m) {
			t.Fatalf("context source %+v (ok %v), metadata %v", src, ok, m.Metadata)
		}
		if l, ok := last[partitionOf(m)]; ok && offsetOf(m) != l+1 {
			t.Fatalf("partition %d: offset %d after %d", partitionOf(m), offsetOf(m), l)
		}
		last[partitionOf(m)] = offsetOf(m)
		if m.Metadata.Get(kafkapubsub.MetadataKafkaKey) == "" || m.Metadata.Get(kafkapubsub.MetadataTimestamp) == "" {
			t.Fatalf("metadata %v lacks the key or the timestamp", m.Metadata)
		}
		m.Ack()
	}
	waitCommitted(t, group, topic, partitions, time.Minute)
}

// With KeyOrdered, messages of different keys of a partition run at once
// (up to MaxInFlight), while each key's messages run one at a time and in
// order, nacked ones included.
func TestKeyOrderedConcurrency(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n, keys, window = 2, 800, 40, 16
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	produceKeyed(t, brokers, topic, n, keys)
	sub := subscriber(t, kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, KeyOrdered: true,
		NackBackoff: 5 * time.Millisecond, MaxNackBackoff: 20 * time.Millisecond,
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu          sync.Mutex
		active      = map[string]bool{}
		last        = map[string]int{}
		nacked      = map[string]bool{}
		inFlight    = map[string]int{}
		maxInFlight = map[string]int{}
		applied     int
		violations  []string
	)
	handle := func(m *message.Message) {
		key, part := m.Metadata.Get(kafkapubsub.MetadataKafkaKey), m.Metadata.Get(kafkapubsub.MetadataPartition)
		seq, _ := strconv.Atoi(string(m.Payload))
		id := fmt.Sprintf("%s/%d", key, seq)
		mu.Lock()
		if active[key] {
			violations = append(violations, id+" delivered while its key had a message in flight")
		}
		active[key] = true
		inFlight[part]++
		maxInFlight[part] = max(maxInFlight[part], inFlight[part])
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		active[key] = false
		inFlight[part]--
		if seq%7 == 3 && !nacked[id] {
			nacked[id] = true
			mu.Unlock()
			m.Nack()
			return
		}
		if l, ok := last[key]; (ok && seq != l+1) || (!ok && seq != 0) {
			violations = append(violations, fmt.Sprintf("%s applied after %s/%d", id, key, l))
		}
		last[key] = seq
		applied++
		mu.Unlock()
		m.Ack()
	}
	go func() {
		for m := range ch {
			go handle(m)
		}
	}()
	testenv.WaitFor(t, 2*time.Minute, "every message to be applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return applied >= n
	})
	waitCommitted(t, group, topic, partitions, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d order violations, first: %v", len(violations), violations[:min(5, len(violations))])
	}
	if applied != n {
		t.Fatalf("applied %d, want %d", applied, n)
	}
	overlapped := false
	for p, m := range maxInFlight {
		if m > window {
			t.Errorf("partition %s had %d in flight, over MaxInFlight %d", p, m, window)
		}
		overlapped = overlapped || m > 1
	}
	if !overlapped {
		t.Fatalf("no partition ran two keys at once (max in flight %v)", maxInFlight)
	}
}

// The committed offset is the lowest unacked one: a message held unacked at
// offset 3 holds the commit there while the window goes on above it, and
// the next owner starts again at 3, redelivering what was acked above it.
// A nacked message comes back with its offset.
func TestWatermarkHoldsCommit(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const n, window, held = 100, 8, 3
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	produceKeyed(t, brokers, topic, n, 1)
	cfg := kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, CommitInterval: -1,
		NackBackoff: 5 * time.Millisecond, DrainTimeout: 2 * time.Second,
	}}
	a := subscriber(t, cfg)
	ch, err := a.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		seen      = map[int64]int{}
		order     []int64
		heldMsg   *message.Message
		consumerA = make(chan struct{})
	)
	go func() {
		defer close(consumerA)
		for m := range ch {
			off := offsetOf(m)
			mu.Lock()
			seen[off]++
			if seen[off] == 1 {
				order = append(order, off)
			}
			switch {
			case off != held:
				m.Ack()
			case seen[off] == 1:
				m.Nack()
			default:
				heldMsg = m
			}
			mu.Unlock()
		}
	}()
	testenv.WaitFor(t, time.Minute, "the window to fill above the held message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return heldMsg != nil && len(seen) >= held+4*window
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	<-consumerA
	if c := kafkatest.CommittedOffsets(t, group, topic, 1)[0]; c != held {
		t.Fatalf("committed %d with offset %d unacked, want %d", c, held, held)
	}
	mu.Lock()
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("first deliveries out of offset order: %v", order)
		}
	}
	if seen[held] != 2 {
		t.Fatalf("offset %d delivered %d times, want 2 (a nack, then held)", held, seen[held])
	}
	if top := order[len(order)-1]; top >= held+4*window {
		t.Fatalf("delivered up to offset %d with offset %d unacked: the window holds %d records", top, held, 4*window)
	}
	mu.Unlock()

	b := subscriber(t, cfg)
	ch, err = b.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var first int64 = -1
	redelivered := 0
	go func() {
		for m := range ch {
			mu.Lock()
			if first < 0 {
				first = offsetOf(m)
			}
			if offsetOf(m) > held && offsetOf(m) < held+4*window {
				redelivered++
			}
			mu.Unlock()
			m.Ack()
		}
	}()
	waitCommitted(t, group, topic, 1, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if first != held {
		t.Fatalf("the next owner started at %d, want %d", first, held)
	}
	if redelivered == 0 {
		t.Fatal("the messages acked above the watermark were not delivered again")
	}
}

// counter counts deliveries per partition and offset.
type counter struct {
	mu  sync.Mutex
	got map[[2]int64]int
	n   int
}

func (c *counter) add(m *message.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[[2]int64{int64(partitionOf(m)), offsetOf(m)}]++
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
	produceKeyed(t, brokers, topic, n, 64)
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
	waitCommitted(t, group, topic, partitions, 2*time.Minute)
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

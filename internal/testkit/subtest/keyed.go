package subtest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// With KeyOrdered, messages of different keys of a partition run at once
// (up to MaxInFlight), while each key's messages run one at a time and in
// order, nacked ones included.
func KeyOrderedConcurrency(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions, n, keys, window = 2, 800, 40, 16
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	ProduceKeyed(t, brokers, topic, n, keys)
	sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, KeyOrdered: true,
		NackBackoff: 5 * time.Millisecond, MaxNackBackoff: 20 * time.Millisecond, Logger: Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
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
		inFlight    = map[string]int{} // per partition
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
		time.Sleep(time.Millisecond) // the handler's work
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
	WaitCommitted(t, group, topic, partitions, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d order violations, first: %v", len(violations), violations[:min(5, len(violations))])
	}
	if applied != n {
		t.Fatalf("applied %d, want %d", applied, n)
	}
	for p, m := range maxInFlight {
		if m > window {
			t.Errorf("partition %s had %d in flight, over MaxInFlight %d", p, m, window)
		}
	}
	overlapped := false
	for _, m := range maxInFlight {
		overlapped = overlapped || m > 1
	}
	if !overlapped {
		t.Fatalf("no partition ran two keys at once (max in flight %v)", maxInFlight)
	}
	t.Logf("max in flight per partition: %v", maxInFlight)
}

// The committed offset is the lowest unacked one: a message held unacked at
// offset 3 holds the commit there while the window goes on above it, and
// the next owner starts again at 3, redelivering what was acked above it.
// A nacked message comes back with its offset while later ones go on.
func WatermarkHoldsCommit(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const n, window, held = 100, 8, 3
	topic := kafkatest.Topic(t, 1)
	group := kafkatest.Name("g")
	ProduceKeyed(t, brokers, topic, n, 1)
	newSub := func() message.Subscriber {
		sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{
			Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, CommitInterval: -1,
			NackBackoff: 5 * time.Millisecond, DrainTimeout: 2 * time.Second, Logger: Logger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	a := newSub()
	ch, err := a.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		seen      = map[int64]int{}
		order     []int64 // first deliveries
		heldMsg   *message.Message
		consumerA = make(chan struct{})
	)
	go func() {
		defer close(consumerA)
		for m := range ch {
			off := OffsetOf(m)
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
				heldMsg = m // never acked
			}
			mu.Unlock()
		}
	}()
	testenv.WaitFor(t, time.Minute, "the window to fill above the held message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return heldMsg != nil && len(seen) >= held+4*window
	})
	// Close drains: every ack sent so far is counted, the held message is
	// given up after DrainTimeout, and the watermark is committed.
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
	if max := order[len(order)-1]; max >= held+4*window {
		t.Fatalf("delivered up to offset %d with offset %d unacked: the window holds %d records", max, held, 4*window)
	}
	mu.Unlock()

	b := newSub()
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
				first = OffsetOf(m)
			}
			if OffsetOf(m) > held && OffsetOf(m) < held+4*window {
				redelivered++
			}
			mu.Unlock()
			m.Ack()
		}
	}()
	WaitCommitted(t, group, topic, 1, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if first != held {
		t.Fatalf("the next owner started at %d, want %d", first, held)
	}
	if redelivered == 0 {
		t.Fatal("the messages acked above the watermark were not delivered again")
	}
}

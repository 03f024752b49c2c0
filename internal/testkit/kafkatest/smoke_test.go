package kafkatest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// TestSmokeResumeAtCommittedOffsets: 1000 keyed messages are produced; a
// group member consumes and commits part of them; a new member of the same
// group resumes exactly at the committed offsets: nothing skipped, nothing
// consumed twice.
func TestSmokeResumeAtCommittedOffsets(t *testing.T) {
	const partitions, total, firstRun = 3, 1000, 400
	brokers := kafkatest.Brokers(t)
	b, _ := kafkatest.Resolve()
	t.Logf("broker: %s %v", b.Kind, b.Addrs)
	topic := kafkatest.Topic(t, partitions)
	group := kafkatest.Name("g")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 100, BatchTimeout: 5 * time.Millisecond}
	msgs := make([]kafka.Message, total)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprint("k", i%37)), Value: []byte(fmt.Sprint(i))}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	end := kafkatest.EndOffsets(t, topic, partitions)
	var sum int64
	for _, o := range end {
		sum += o
	}
	if sum != total {
		t.Fatalf("end offsets %v sum to %d, want %d", end, sum, total)
	}

	seen := map[string]int{}
	consume := func(n int) {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: group, Topic: topic,
			StartOffset: kafka.FirstOffset, CommitInterval: 0, MaxWait: 100 * time.Millisecond,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second, HeartbeatInterval: time.Second})
		defer r.Close()
		for i := 0; i < n; i++ {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatalf("fetch after %d: %v", i, err)
			}
			seen[string(m.Value)]++
			if err := r.CommitMessages(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	consume(firstRun)
	committed := kafkatest.CommittedOffsets(t, group, topic, partitions)
	var sumCommitted int64
	for _, o := range committed {
		sumCommitted += o
	}
	if sumCommitted != firstRun {
		t.Fatalf("committed offsets %v sum to %d after %d messages", committed, sumCommitted, firstRun)
	}
	consume(total - firstRun)
	for i := 0; i < total; i++ {
		if n := seen[fmt.Sprint(i)]; n != 1 {
			t.Fatalf("message %d consumed %d times", i, n)
		}
	}
	if got := kafkatest.CommittedOffsets(t, group, topic, partitions); fmt.Sprint(got) != fmt.Sprint(end) {
		t.Fatalf("committed %v, want the end offsets %v", got, end)
	}
	// Nothing is left for the group.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: group, Topic: topic, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if m, err := r.FetchMessage(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the end: got %q at %d/%d, %v", m.Value, m.Partition, m.Offset, err)
	}
}

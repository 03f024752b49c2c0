package kgopubsub_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Subscribe throughput, side by side on one topic in one run: kgopubsub's
// Subscriber, bare kgo (a group consumer that polls and counts, with
// read_committed and autocommit, doing nothing per record), bare kgo
// handing a Watermill message per record over a channel, and
// kafkapubsub's Subscriber, each with MaxInFlight 1 (one message per
// partition at a time) and 64 (a window):
//
//	go test -run '^$' -bench Subscribe -benchtime 3x ./kgopubsub/
//
// Each iteration consumes the whole topic (benchRecords records of
// benchValue bytes on benchPartitions partitions) in a new group, acking
// every message as it arrives in one goroutine; msgs/s counts from the
// first record (the group joined) to the last. cpu-ns/msg is the process's
// CPU time (user and system, the client's fetching included) from the
// consumer's start to the last record, per record: on a loaded machine it
// varies far less than msgs/s.
func BenchmarkSubscribe(b *testing.B) {
	brokers := kafkatest.Brokers(b)
	topic := benchTopic(b, brokers)
	b.Run("bare-kgo", func(b *testing.B) {
		benchConsume(b, func(ctx context.Context, group string, count func(int)) func() {
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for ctx.Err() == nil {
					fs := cl.PollFetches(ctx)
					if n := fs.NumRecords(); n > 0 {
						count(n)
					}
				}
			}()
			return func() { <-done; cl.Close() }
		})
	})
	// The floor of any Watermill subscriber on kgo: bare kgo that makes a
	// Watermill message of each record and hands it over a channel to a
	// goroutine that acks it, waiting for no ack.
	b.Run("bare-kgo-watermill-channel", func(b *testing.B) {
		benchConsume(b, func(ctx context.Context, group string, count func(int)) func() {
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumerGroup(group),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				b.Fatal(err)
			}
			ch := make(chan *message.Message)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for m := range ch {
					m.Ack()
					count(1)
				}
			}()
			go func() {
				defer close(ch)
				for ctx.Err() == nil {
					cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
						m := message.NewMessage("", r.Value)
						m.Metadata.Set(kafkapubsub.MetadataOffset, strconv.FormatInt(r.Offset, 10))
						select {
						case ch <- m:
						case <-ctx.Done():
						}
					})
				}
			}()
			return func() { <-done; cl.Close() }
		})
	})
	for _, window := range []int{1, 64} {
		b.Run(fmt.Sprintf("kgopubsub/inflight=%d", window), func(b *testing.B) {
			benchConsume(b, func(ctx context.Context, group string, count func(int)) func() {
				sub, err := kgopubsub.NewSubscriber(&kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
					Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, Logger: quietLogger()}})
				if err != nil {
					b.Fatal(err)
				}
				return benchSubscriber(ctx, b, sub, topic, count)
			})
		})
		b.Run(fmt.Sprintf("kafkapubsub/inflight=%d", window), func(b *testing.B) {
			benchConsume(b, func(ctx context.Context, group string, count func(int)) func() {
				sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
					Brokers: brokers, ConsumerGroup: group, MaxInFlight: window, Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				return benchSubscriber(ctx, b, sub, topic, count)
			})
		})
	}
}

const (
	benchRecords    = 200_000
	benchPartitions = 4
	benchValue      = 100
)

var (
	benchOnce      sync.Once
	benchTopicName string
)

// benchTopic writes the benchmark's topic once per process.
func benchTopic(b *testing.B, brokers []string) string {
	benchOnce.Do(func() {
		topic := kafkatest.Name("bench")
		kafkatest.CreateTopic(b, topic, benchPartitions)
		wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond, BatchSize: 5000, BatchBytes: 4 << 20}
		defer wr.Close()
		value := make([]byte, benchValue)
		msgs := make([]kafka.Message, 0, 5000)
		for i := 0; i < benchRecords; i++ {
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "k%d", i%1000), Value: value})
			if len(msgs) == cap(msgs) {
				if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
					b.Fatal(err)
				}
				msgs = msgs[:0]
			}
		}
		benchTopicName = topic
	})
	if benchTopicName == "" {
		b.Fatal("the benchmark topic was not written")
	}
	return benchTopicName
}

// benchSubscriber acks every message of sub's subscription to topic.
func benchSubscriber(ctx context.Context, b *testing.B, sub message.Subscriber, topic string, count func(int)) func() {
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			m.Ack()
			count(1)
		}
	}()
	return func() { _ = sub.Close(); <-done }
}

// benchConsume runs b.N iterations, each consuming the benchmark topic
// whole in a new group with the consumer start makes, and reports msgs/s
// from the first record to the last.
func benchConsume(b *testing.B, start func(ctx context.Context, group string, count func(int)) (stop func())) {
	var total, cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		n := 0
		var first time.Time
		all := make(chan time.Time, 1)
		cpu0 := cpuTime()
		stop := start(ctx, kafkatest.Name("bench"), func(k int) {
			mu.Lock()
			defer mu.Unlock()
			if n == 0 {
				first = time.Now()
			}
			n += k
			if n >= benchRecords && n-k < benchRecords {
				all <- time.Now()
			}
		})
		b.StartTimer()
		var last time.Time
		select {
		case last = <-all:
		case <-time.After(5 * time.Minute):
			b.Fatalf("%d of %d records in 5 minutes", n, benchRecords)
		}
		b.StopTimer()
		cpu += cpuTime() - cpu0
		cancel()
		stop()
		mu.Lock()
		total += last.Sub(first)
		mu.Unlock()
	}
	b.ReportMetric(float64(b.N*benchRecords)/total.Seconds(), "msgs/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*benchRecords), "cpu-ns/msg")
	}
}

package kafkapubsub_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// Throughput of a Watermill router on the Subscriber with a handler that
// waits 5 ms per message, 4 partitions, many keys:
//
//	go test -run '^$' -bench Throughput -benchtime 3x ./kafkapubsub/
//
// keyed-concurrency runs 64 messages per partition at once (MaxInFlight 64,
// KeyOrdered), partition-sequential one (MaxInFlight 1). Each iteration
// handles keyedBatch messages; msgs/s counts from the first message handled
// (the group joined) to the last. keyed-latency (keyedLatencyBatch messages
// per iteration, written in rounds every 10 ms by an async Writer in the same
// process) offers half the rate that keyed-concurrency reached in the same
// run (2000 msgs/s when it runs alone) and reports the rate it reached and
// the p50 and p99 of each message's time from its write to the end of its
// handler.
func BenchmarkThroughput(b *testing.B) {
	b.Run("keyed-concurrency", func(b *testing.B) {
		keyedMaxRate = benchKeyedBacklog(b, 64)
	})
	b.Run("partition-sequential", func(b *testing.B) {
		benchKeyedBacklog(b, 1)
	})
	b.Run("keyed-latency", benchKeyedLatency)
}

const (
	keyedBatch      = 2000
	keyedPartitions = 4
	keyedKeys       = 5000
	keyedWork       = 5 * time.Millisecond
	// keyedLatencyBatch is keyed-latency's messages per iteration: a few
	// seconds of load.
	keyedLatencyBatch = 10000
)

// keyedMaxRate is the rate keyed-concurrency reached, for keyed-latency.
var keyedMaxRate float64

// keyedBench is a topic, a router on it whose handler waits keyedWork, and
// the count of messages handled.
type keyedBench struct {
	brokers []string
	topic   string
	handled atomic.Int64
	// onDone, when set, is called as each message's handler ends.
	onDone func(m *message.Message, end time.Time)
	stop   func()
}

// newKeyedBench starts a router with maxInFlight on a new topic.
func newKeyedBench(b *testing.B, maxInFlight int, onDone func(*message.Message, time.Time)) *keyedBench {
	b.Helper()
	kafkatest.RequireReal(b)
	return newKeyedBenchOn(b, kafkatest.Topic(b, keyedPartitions), maxInFlight, onDone)
}

// newKeyedBenchOn starts a router with maxInFlight on topic.
func newKeyedBenchOn(b *testing.B, topic string, maxInFlight int, onDone func(*message.Message, time.Time)) *keyedBench {
	b.Helper()
	kb := &keyedBench{brokers: kafkatest.Brokers(b), topic: topic, onDone: onDone}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: kb.brokers, ConsumerGroup: kafkatest.Name("bench"), MaxInFlight: maxInFlight, KeyOrdered: true,
		Logger: quietLogger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	r.AddNoPublisherHandler("bench", kb.topic, sub, func(m *message.Message) error {
		time.Sleep(keyedWork) // the handler's work: a call to another service
		if kb.onDone != nil {
			kb.onDone(m, time.Now())
		}
		kb.handled.Add(1)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	<-r.Running()
	var once sync.Once
	kb.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = sub.Close()
		})
	}
	b.Cleanup(kb.stop)
	return kb
}

// write writes n records with random keys among keyedKeys, each value the
// write time in Unix nanoseconds.
func (kb *keyedBench) write(b *testing.B, wr *kafka.Writer, rnd *rand.Rand, n int) {
	b.Helper()
	msgs := make([]kafka.Message, n)
	now := make([]byte, 8)
	binary.BigEndian.PutUint64(now, uint64(time.Now().UnixNano()))
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "k%05d", rnd.IntN(keyedKeys)), Value: now}
	}
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		b.Fatal(err)
	}
}

func (kb *keyedBench) writer() *kafka.Writer {
	return &kafka.Writer{Addr: kafka.TCP(kb.brokers...), Topic: kb.topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 1000}
}

// waitHandled waits until n messages are handled.
func (kb *keyedBench) waitHandled(b *testing.B, n int64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for kb.handled.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("handled %d of %d messages in 5 minutes", kb.handled.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// benchKeyedBacklog handles b.N × keyedBatch messages written beforehand and
// returns the rate.
func benchKeyedBacklog(b *testing.B, maxInFlight int) float64 {
	rnd := rand.New(rand.NewPCG(1, 2))
	total := int64(b.N * keyedBatch)
	b.StopTimer()
	// Write first, then join: the group starts on a backlog.
	kafkatest.RequireReal(b)
	filler := &keyedBench{brokers: kafkatest.Brokers(b), topic: kafkatest.Topic(b, keyedPartitions)}
	wr := filler.writer()
	for range b.N {
		filler.write(b, wr, rnd, keyedBatch)
	}
	_ = wr.Close()
	kb := newKeyedBenchOn(b, filler.topic, maxInFlight, nil)
	kb.waitHandled(b, 1)
	start, h0 := time.Now(), kb.handled.Load()
	b.StartTimer()
	for i := range b.N {
		kb.waitHandled(b, h0+(total-h0)*int64(i+1)/int64(b.N))
	}
	b.StopTimer()
	rate := float64(total-h0) / time.Since(start).Seconds()
	b.ReportMetric(rate, "msgs/s")
	kb.stop()
	return rate
}

// benchKeyedLatency offers half of keyed-concurrency's rate to the keyed
// router for b.N × keyedLatencyBatch messages and reports the latency percentiles.
func benchKeyedLatency(b *testing.B) {
	rate := keyedMaxRate / 2
	if rate <= 0 {
		rate = 2000
	}
	var mu sync.Mutex
	var lat []time.Duration
	kb := newKeyedBench(b, 64, func(m *message.Message, end time.Time) {
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(m.Payload)))
		mu.Lock()
		lat = append(lat, end.Sub(sent))
		mu.Unlock()
	})
	// The group joins on a first message before the load starts.
	rnd := rand.New(rand.NewPCG(3, 4))
	wr := kb.writer()
	kb.write(b, wr, rnd, 1)
	kb.waitHandled(b, 1)
	_ = wr.Close()
	// Writes at the offered rate do not wait for the broker's answer.
	var writeErr atomic.Value
	wr = kb.writer()
	wr.Async = true
	wr.Completion = func(_ []kafka.Message, err error) {
		if err != nil {
			writeErr.Store(err)
		}
	}
	defer wr.Close()
	mu.Lock()
	lat = lat[:0]
	mu.Unlock()
	total := b.N * keyedLatencyBatch
	const tick = 10 * time.Millisecond
	per := max(1, int(rate*tick.Seconds()))
	b.ResetTimer()
	start := time.Now()
	t := time.NewTicker(tick)
	for sent := 0; sent < total; sent += per {
		<-t.C
		kb.write(b, wr, rnd, min(per, total-sent))
	}
	t.Stop()
	wrote := time.Since(start)
	if err, _ := writeErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	kb.waitHandled(b, int64(total)+1)
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(rate, "offered-msgs/s")
	b.Logf("wrote in %v, handled in %v", wrote, time.Since(start))
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	kb.stop()
}

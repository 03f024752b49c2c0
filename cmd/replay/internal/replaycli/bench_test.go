package replaycli_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// BenchmarkCopy compares `replay copy` of a 20 000-record, 3-partition
// topic with a bare kafka-go loop that reads each partition and writes the
// records to another topic, same broker, same run:
//
//	go test -run '^$' -bench Copy -benchtime 3x ./cmd/replay/internal/replaycli
func BenchmarkCopy(b *testing.B) {
	const n = 20000
	brokers := kafkatest.Brokers(b)
	src := kafkatest.Name("bench-src")
	kafkatest.CreateTopic(b, src, 3)
	recs := make([]kafka.Message, n)
	for i := range recs {
		recs[i] = kafka.Message{Key: []byte(fmt.Sprint("k", i%97)), Value: bytes.Repeat([]byte("x"), 200),
			Headers: []kafka.Header{{Key: "_watermill_message_uuid", Value: []byte(fmt.Sprint("u-", i))}}}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: src, Balancer: &kafka.Murmur2Balancer{}, BatchSize: 1000, BatchTimeout: 10 * time.Millisecond}
	if err := w.WriteMessages(context.Background(), recs...); err != nil {
		b.Fatal(err)
	}
	w.Close()
	report := func(b *testing.B, d time.Duration) { b.ReportMetric(float64(n*b.N)/d.Seconds(), "msgs/s") }
	b.Run("replay-copy", func(b *testing.B) {
		var d time.Duration
		for i := 0; i < b.N; i++ {
			dst := kafkatest.Name("bench-dst")
			kafkatest.CreateTopic(b, dst, 3)
			start := time.Now()
			var out, errs bytes.Buffer
			if code := replaycli.Main(context.Background(), []string{"copy", "--brokers", brokers[0], "--from", src, "--to", dst}, &out, &errs); code != 0 {
				b.Fatalf("exit %d: %s", code, errs.String())
			}
			d += time.Since(start)
		}
		report(b, d)
	})
	b.Run("kafka-go-loop", func(b *testing.B) {
		var d time.Duration
		for i := 0; i < b.N; i++ {
			dst := kafkatest.Name("bench-dst")
			kafkatest.CreateTopic(b, dst, 3)
			end := kafkatest.EndOffsets(b, src, 3)
			start := time.Now()
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dst, Balancer: &kafka.Murmur2Balancer{},
				RequiredAcks: kafka.RequireAll, BatchSize: 500, BatchTimeout: 10 * time.Millisecond}
			for p := 0; p < 3; p++ {
				r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: src, Partition: p, MaxWait: 100 * time.Millisecond, MaxBytes: 10 << 20})
				batch := make([]kafka.Message, 0, 500)
				for {
					m, err := r.FetchMessage(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					batch = append(batch, kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
					last := m.Offset+1 >= end[p]
					if len(batch) == cap(batch) || last {
						if err := w.WriteMessages(context.Background(), batch...); err != nil {
							b.Fatal(err)
						}
						batch = batch[:0]
					}
					if last {
						break
					}
				}
				r.Close()
			}
			w.Close()
			d += time.Since(start)
		}
		report(b, d)
	})
}

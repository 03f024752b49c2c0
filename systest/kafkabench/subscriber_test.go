package kafkabench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

const benchMessages = 20000

// seedTopic produces benchMessages records (keyed, with UUID headers) into
// a new 4-partition topic, deleted when b ends.
func seedTopic(b *testing.B) string {
	brokers := kafkatest.Brokers(b)
	name := kafkatest.Name("bench")
	kafkatest.CreateTopic(b, name, 4)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	recs := make([]kafka.Message, benchMessages)
	for i := range recs {
		account := fmt.Sprint("acc-", i%101)
		recs[i] = kafka.Message{Key: []byte(account), Value: []byte(`{"account":"` + account + `","amount":1}`),
			Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(watermill.NewUUID())}}}
	}
	if err := w.WriteMessages(context.Background(), recs...); err != nil {
		b.Fatal(err)
	}
	return name
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// BenchmarkSubscriber compares consuming the same pre-produced topic (20 000
// records, 4 partitions, acking every message, a new group per iteration):
// this project's Subscriber, a bare kafka-go Reader loop (FetchMessage +
// CommitMessages), and watermill-kafka's sarama Subscriber.
func BenchmarkSubscriber(b *testing.B) {
	topic := seedTopic(b)
	brokers := kafkatest.Brokers(b)
	consume := func(b *testing.B, sub message.Subscriber) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < benchMessages; i++ {
			select {
			case m := <-msgs:
				m.Ack()
			case <-time.After(60 * time.Second):
				b.Fatalf("stalled after %d messages", i)
			}
		}
		_ = sub.Close()
	}
	report := func(b *testing.B, start time.Time) {
		b.ReportMetric(float64(benchMessages*b.N)/time.Since(start).Seconds(), "msgs/s")
	}
	b.Run("exactly", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Name("bench"), Logger: quietLogger()})
			if err != nil {
				b.Fatal(err)
			}
			consume(b, sub)
		}
		report(b, start)
	})
	b.Run("kafka-go-reader", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: kafkatest.Name("bench"), Topic: topic,
				StartOffset: kafka.FirstOffset, CommitInterval: 200 * time.Millisecond, MaxWait: 250 * time.Millisecond})
			ctx := context.Background()
			for n := 0; n < benchMessages; n++ {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.CommitMessages(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			_ = r.Close()
		}
		report(b, start)
	})
	b.Run("watermill-kafka-sarama", func(b *testing.B) {
		start := time.Now()
		for i := 0; i < b.N; i++ {
			cfg := wkafka.DefaultSaramaSubscriberConfig()
			cfg.Version = sarama.V3_0_0_0
			cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
			sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
				Brokers: brokers, ConsumerGroup: kafkatest.Name("bench"), Unmarshaler: wkafka.DefaultMarshaler{},
				OverwriteSaramaConfig: cfg,
			}, watermill.NopLogger{})
			if err != nil {
				b.Fatal(err)
			}
			consume(b, sub)
		}
		report(b, start)
	})
}

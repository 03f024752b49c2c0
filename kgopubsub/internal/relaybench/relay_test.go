// Package relaybench measures the outbox relay on each transport's
// Publisher, beside bare producers of each client, side by side in one
// run:
//
//	go test -run '^$' -bench Relay -benchtime 3x ./internal/relaybench
//
// (from the kgopubsub module, with TEST_DATABASE_URL and
// TEST_KAFKA_BROKERS set). Each iteration writes 20 000 outbox rows over
// 101 keys, in transactions of 100, and relays them with outbox.Relay
// (batches of 100) through kgopubsub's Publisher (franz-go's idempotent
// producer, acks=all) and through kafkapubsub's (kafka-go's Writer); then
// the same records are produced by a bare kafka-go Writer and a bare kgo
// client (idempotent, acks=all), in calls of 100 records, each waiting for
// its acknowledgements, as the relay's publisher calls do.
package relaybench

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/outbox"
)

const (
	rows  = 20000
	batch = 100
	parts = 4
)

func BenchmarkRelay(b *testing.B) {
	msgs := make([]*message.Message, rows)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"n":%d,"account":"acc-%d"}`, i, i%101)))
		msgs[i].Metadata.Set(outbox.KeyMetadata, fmt.Sprint("acc-", i%101))
	}
	brokers := kafkatest.Brokers(b)
	quiet := slog.New(slog.DiscardHandler)
	var kgoRelay, kafkaGoRelay, kgoBare, kafkaGoBare time.Duration
	for range b.N {
		kgoRelay += relayOnce(b, msgs, func() (message.Publisher, error) {
			return kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet}})
		})
		kafkaGoRelay += relayOnce(b, msgs, func() (message.Publisher, error) {
			return kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet})
		})
		kgoBare += kgoOnce(b, brokers, msgs)
		kafkaGoBare += kafkaGoOnce(b, brokers, msgs)
	}
	rate := func(d time.Duration) float64 { return float64(rows*b.N) / d.Seconds() }
	b.ReportMetric(rate(kgoRelay), "relay-franz-go-msgs/s")
	b.ReportMetric(rate(kafkaGoRelay), "relay-kafka-go-msgs/s")
	b.ReportMetric(rate(kgoBare), "bare-kgo-msgs/s")
	b.ReportMetric(rate(kafkaGoBare), "bare-kafka-go-writer-msgs/s")
	b.ReportMetric(kafkaGoRelay.Seconds()/kgoRelay.Seconds(), "franz-go/kafka-go-relay")
	b.ReportMetric(kafkaGoBare.Seconds()/kgoRelay.Seconds(), "franz-go-relay/bare-kafka-go-writer")
}

// relayOnce writes msgs to a new schema's outbox and returns how long a
// relay on the publisher took to publish them all.
func relayOnce(b *testing.B, msgs []*message.Message, newPub func() (message.Publisher, error)) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	db := pgtest.New(b)
	topic := kafkatest.Topic(b, parts)
	w, err := outbox.NewWriter(&outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < len(msgs); i += batch {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.WriteTx(ctx, tx, topic, msgs[i:i+batch]...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	pub, err := newPub()
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: db.Schema}, BatchSize: batch,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	pending := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_outbox")+" WHERE status = 'PENDING'").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	start := time.Now()
	for pending() > 0 {
		if _, err := r.RunOnce(ctx); err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(start)
	if end := kafkatest.EndOffsets(b, topic, parts); sum(end) != rows {
		b.Fatalf("%d records on the topic, want %d", sum(end), rows)
	}
	return d
}

func kgoOnce(b *testing.B, brokers []string, msgs []*message.Message) time.Duration {
	b.StopTimer()
	topic := kafkatest.Topic(b, parts)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Key: []byte(m.Metadata.Get(outbox.KeyMetadata)), Value: m.Payload}
	}
	b.StartTimer()
	start := time.Now()
	for i := 0; i < len(recs); i += batch {
		if err := cl.ProduceSync(context.Background(), recs[i:i+batch]...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func kafkaGoOnce(b *testing.B, brokers []string, msgs []*message.Message) time.Duration {
	b.StopTimer()
	topic := kafkatest.Topic(b, parts)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: batch, BatchTimeout: 5 * time.Millisecond}
	defer w.Close()
	recs := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		recs[i] = kafka.Message{Key: []byte(m.Metadata.Get(outbox.KeyMetadata)), Value: m.Payload}
	}
	b.StartTimer()
	start := time.Now()
	for i := 0; i < len(recs); i += batch {
		if err := w.WriteMessages(context.Background(), recs[i:i+batch]...); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

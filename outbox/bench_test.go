package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/outbox"
)

// BenchmarkRelay compares relaying 20 000 outbox rows over 101 keys
// (written beforehand) with a bare kafka-go Writer pushing the same 20 000
// messages in batches of 100, same broker: each iteration runs one, then
// the other, so both see the same machine. It reports both rates and their
// ratio. Run:
//
//	go test -run '^$' -bench Relay -benchtime 3x ./outbox
func BenchmarkRelay(b *testing.B) {
	const n = 20000
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"n":%d,"account":"acc-%d"}`, i, i%101)))
		msgs[i].Metadata.Set(outbox.KeyMetadata, fmt.Sprint("acc-", i%101))
	}
	var relay, writer time.Duration
	for i := 0; i < b.N; i++ {
		relay += relayOnce(b, msgs)
		writer += writerOnce(b, msgs)
	}
	b.ReportMetric(float64(n*b.N)/relay.Seconds(), "relay-msgs/s")
	b.ReportMetric(float64(n*b.N)/writer.Seconds(), "writer-msgs/s")
	b.ReportMetric(writer.Seconds()/relay.Seconds(), "ratio")
}

func writerOnce(b *testing.B, msgs []*message.Message) time.Duration {
	topic := kafkatest.Name("bench")
	kafkatest.CreateTopic(b, topic, 4)
	w := &kafka.Writer{Addr: kafka.TCP(kafkatest.Brokers(b)...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 100, BatchTimeout: 5 * time.Millisecond}
	defer w.Close()
	recs := make([]kafka.Message, len(msgs))
	for j, m := range msgs {
		recs[j] = kafka.Message{Key: []byte(m.Metadata.Get(outbox.KeyMetadata)), Value: m.Payload}
	}
	start := time.Now()
	for j := 0; j < len(recs); j += 100 { // batches of the relay's size
		if err := w.WriteMessages(context.Background(), recs[j:j+100]...); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func relayOnce(b *testing.B, msgs []*message.Message) time.Duration {
	f := newFixture(b, 4)
	ctx := context.Background()
	for i := 0; i < len(msgs); i += 100 {
		tx, err := f.db.Pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.w.WriteTx(ctx, tx, f.topic, msgs[i:i+100]...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cp := &countingPublisher{Publisher: f.pub}
	r := f.relay(b, cp, &outbox.RelayConfig{BatchSize: 100})
	start := time.Now()
	for f.pending(b) > 0 {
		if _, err := r.RunOnce(ctx); err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(start)
	b.Logf("relay: %d publish calls, %v of %v in Publish", cp.calls.Load(), time.Duration(cp.nanos.Load()), d)
	return d
}

type countingPublisher struct {
	message.Publisher
	calls, nanos atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	start := time.Now()
	defer func() { p.calls.Add(1); p.nanos.Add(int64(time.Since(start))) }()
	return p.Publisher.Publish(topic, msgs...)
}

// BenchmarkWriteTx is the cost of WriteTx inside a handler's transaction:
// a transaction with one UPDATE, without and with writing one message.
//
//	go test -run '^$' -bench WriteTx -count 3 ./outbox
func BenchmarkWriteTx(b *testing.B) {
	f := newFixture(b, 1)
	ctx := context.Background()
	if _, err := f.db.Pool.Exec(ctx, "CREATE TABLE "+f.db.Table("accounts")+" (id int PRIMARY KEY, balance bigint NOT NULL); INSERT INTO "+f.db.Table("accounts")+" SELECT g, 0 FROM generate_series(0, 999) g"); err != nil {
		b.Fatal(err)
	}
	update := "UPDATE " + f.db.Table("accounts") + " SET balance = balance + 1 WHERE id = $1"
	for _, write := range []bool{false, true} {
		name := "update-only"
		if write {
			name = "update+write"
		}
		b.Run(name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					tx, err := f.db.Pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := tx.Exec(ctx, update, i%1000); err != nil {
						b.Fatal(err)
					}
					if write {
						m := message.NewMessage(watermill.NewUUID(), []byte(`{"event":"topped_up"}`))
						if err := f.w.WriteTx(ctx, tx, f.topic, m); err != nil {
							b.Fatal(err)
						}
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

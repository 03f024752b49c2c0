package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
)

const benchMessages = 20000

// seedTopic produces benchMessages records (with UUID headers) into a new
// 4-partition topic, deleted when b ends.
func seedTopic(b *testing.B) string {
	brokers := kafkatest.Brokers(b)
	name := kafkatest.Name("bench")
	kafkatest.CreateTopic(b, name, 4)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: 10 * time.Millisecond}
	defer w.Close()
	recs := make([]kafka.Message, benchMessages)
	for i := range recs {
		recs[i] = record(watermill.NewUUID(), fmt.Sprint("acc-", i%101), 1)
	}
	if err := w.WriteMessages(context.Background(), recs...); err != nil {
		b.Fatal(err)
	}
	return name
}

// BenchmarkSubscriber, this package's Subscriber side by side with a bare
// kafka-go Reader and watermill-kafka, is in systest/kafkabench (a module of
// its own, so that sarama stays out of the library's go.mod).

// BenchmarkMiddlewareEndToEnd consumes the pre-produced topic through a
// Watermill router whose handler runs one UPDATE in a transaction: with the
// dedupe middleware (the transaction is the middleware's) and without it
// (the handler opens and commits the same transaction itself). Run:
//
//	go test -run '^$' -bench MiddlewareEndToEnd -benchtime 3x ./consumer
func BenchmarkMiddlewareEndToEnd(b *testing.B) {
	topic := seedTopic(b)
	for _, withDedupe := range []bool{false, true} {
		name := "without"
		if withDedupe {
			name = "with-dedupe"
		}
		b.Run(name, func(b *testing.B) {
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				elapsed += runLedgerOnce(b, topic, withDedupe)
			}
			b.ReportMetric(float64(benchMessages*b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

func runLedgerOnce(b *testing.B, topic string, withDedupe bool) time.Duration {
	b.StopTimer()
	w := newWorld(b, 1)
	if _, err := w.db.Pool.Exec(context.Background(), "INSERT INTO "+w.db.Table("balances")+" SELECT 'acc-' || g, 0 FROM generate_series(0, 100) g"); err != nil {
		b.Fatal(err)
	}
	group := kafkatest.Name("bench")
	update := "UPDATE " + w.db.Table("balances") + " SET balance = balance + 1 WHERE account = $1"
	var mu sync.Mutex
	done := 0
	finished := make(chan struct{})
	count := func() {
		mu.Lock()
		done++
		if done == benchMessages {
			close(finished)
		}
		mu.Unlock()
	}
	var h message.HandlerFunc
	if withDedupe {
		h = consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			_, err := tx.Exec(ctx, update, msg.Metadata.Get(kafkapubsub.MetadataKafkaKey))
			return nil, err
		})
	} else {
		h = func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, err := w.db.Pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, update, msg.Metadata.Get(kafkapubsub.MetadataKafkaKey)); err != nil {
				return nil, err
			}
			return nil, tx.Commit(ctx)
		}
	}
	counted := func(msg *message.Message) ([]*message.Message, error) {
		outs, err := h(msg)
		if err == nil {
			defer count()
		}
		return outs, err
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NewSlogLogger(quietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: w.brokers, ConsumerGroup: group, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	handler := r.AddConsumerHandler("ledger", topic, sub, func(msg *message.Message) error {
		_, err := counted(msg)
		return err
	})
	if withDedupe {
		mw, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		handler.AddMiddleware(mw.Middleware)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.StartTimer()
	start := time.Now()
	go func() { _ = r.Run(ctx) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d messages handled", done, benchMessages)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	_ = r.Close()
	return elapsed
}

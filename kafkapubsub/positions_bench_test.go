package kafkapubsub_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// BenchmarkPositions measures the cost of keeping positions in Postgres
// (SubscriberConfig.Positions), side by side: each iteration consumes two
// copies of a backlog at the same time, one without positions and one with
// them (each on a group and a schema of its own), through the dedupe
// middleware (per message, MaxInFlight 1 per partition) or a BatchConsumer,
// with the default CommitInterval. It reports both rates and the cost in
// per cent.
//
//	go test -run '^$' -bench Positions -benchtime 6x ./kafkapubsub
func BenchmarkPositions(b *testing.B) {
	b.Run("per-message", func(b *testing.B) { benchPositions(b, false, 3000) })
	b.Run("batch", func(b *testing.B) { benchPositions(b, true, 20000) })
}

func benchPositions(b *testing.B, batchMode bool, n int) {
	kafkatest.RequireReal(b)
	const partitions = 4
	brokers := kafkatest.Brokers(b)
	var rate [2]float64 // without, with
	for it := range b.N {
		// Two copies of one backlog, consumed at the same time, one without
		// positions and one with: both meet the machine's load alike.
		var topics [2]string
		for i := range topics {
			topics[i] = kafkatest.Topic(b, partitions)
			writePositionsBacklog(b, brokers, topics[i], n)
		}
		var round [2]float64
		var wg sync.WaitGroup
		for i := range round {
			wg.Add(1)
			go func() { defer wg.Done(); round[i] = consumeBacklog(b, brokers, topics[i], n, batchMode, i == 1) }()
		}
		wg.Wait()
		rate[0] += round[0]
		rate[1] += round[1]
		b.Logf("round %d: %.0f msgs/s without, %.0f with (%+.1f%%)", it, round[0], round[1], 100*(1-round[1]/round[0]))
	}
	off, on := rate[0]/float64(b.N), rate[1]/float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(off, "msgs/s-without")
	b.ReportMetric(on, "msgs/s-with")
	b.ReportMetric(100*(1-on/off), "cost-%")
}

func writePositionsBacklog(b *testing.B, brokers []string, topic string, n int) {
	b.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprint("k", i%500)), Value: []byte(`{"amount":1}`),
			Headers: []kafka.Header{{Key: "_watermill_message_uuid", Value: []byte(watermill.NewUUID())}}}
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 1000}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		b.Fatal(err)
	}
}

// consumeBacklog consumes topic's n messages with a new group and schema and
// returns the rate from the first application to the last.
func consumeBacklog(b *testing.B, brokers []string, topic string, n int, batchMode, positions bool) float64 {
	b.Helper()
	db := pgtest.New(b)
	ctx := context.Background()
	applies := db.Table("applies")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applies+" (uuid text NOT NULL, key text NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	cfg := &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Name("bench"), Logger: quietLogger()}
	if batchMode {
		cfg.MaxInFlight = 256
	}
	if positions {
		cfg.Positions = store.Positions()
	}
	sub, err := kafkapubsub.NewSubscriber(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var first, last atomic.Int64
	var applied atomic.Int64
	allDone := make(chan struct{})
	var once sync.Once
	mark := func(k int) {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		last.Store(now)
		if applied.Add(int64(k)) >= int64(n) {
			once.Do(func() { close(allDone) })
		}
	}
	apply := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		uuids, keys := make([]string, len(msgs)), make([]string, len(msgs))
		for i, m := range msgs {
			uuids[i], keys[i] = m.UUID, m.Metadata.Get(kafkapubsub.MetadataKafkaKey)
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+applies+" SELECT * FROM unnest($1::text[], $2::text[])", uuids, keys)
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if batchMode {
		bc, err := consumer.NewBatchConsumer(store, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			if err := apply(ctx, tx, msgs); err != nil {
				return nil, err
			}
			mark(len(msgs))
			return nil, nil
		}, &consumer.BatchConfig{Config: consumer.Config{Scope: "bench", Logger: quietLogger()}, MaxSize: 200, Workers: 4})
		if err != nil {
			b.Fatal(err)
		}
		go func() { defer close(done); _ = bc.Subscribe(rctx, sub, topic) }()
	} else {
		mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "bench", Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
		if err != nil {
			b.Fatal(err)
		}
		r.AddMiddleware(mw.Middleware)
		h := consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if err := apply(ctx, tx, []*message.Message{msg}); err != nil {
				return nil, err
			}
			mark(1)
			return nil, nil
		})
		r.AddNoPublisherHandler("bench", topic, sub, func(m *message.Message) error { _, err := h(m); return err })
		go func() { defer close(done); _ = r.Run(rctx) }()
	}
	select {
	case <-allDone:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages applied in 5 minutes", applied.Load(), n)
	}
	cancel()
	<-done
	_ = sub.Close()
	if positions {
		if saved, err := cfg.Positions.Load(ctx, cfg.ConsumerGroup, topic, []int{0, 1, 2, 3}); err != nil || len(saved) == 0 {
			b.Fatalf("no position saved: %v %v", saved, err)
		}
	}
	return float64(n) / (float64(last.Load()-first.Load()) / 1e9)
}

package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker/measure"
)

// throughputMessages is what each iteration of a throughput sub-benchmark
// consumes: ledger topups over throughputAccounts accounts, pre-produced to
// a new 6-partition topic.
const (
	throughputMessages  = 20000
	throughputAccounts  = 500
	throughputBatchSize = 500
)

// BenchmarkThroughput measures the ledger worker's pipelines on real Kafka
// and Postgres, each iteration consuming throughputMessages topups from a
// new topic with a new group; msgs/s counts from the first message handled
// to the last one committed (the group's join is left out):
//
//   - per-message-dedupe: a Watermill router with the dedupe middleware, one
//     transaction per message (the worker's default mode);
//   - batch-dedupe: consumer.BatchConsumer, batches of up to 500 messages
//     claimed with Store.DoBatch and applied set-based (handleBatch);
//   - batch-plain: the same batch pipeline without the claim;
//   - batch-dedupe-v7: batch-dedupe with time-ordered command IDs (UUIDv7)
//     instead of Watermill's random ones: its keys land on the right edge of
//     the key index (docs/keys.md);
//   - batch-dedupe and batch-dedupe-v7 claim on the default, partitioned
//     key layout; batch-dedupe-single-table and batch-dedupe-v7-single-table
//     are the same two on pgstore.LayoutSingleTable;
//   - batch-floor-v7: batch-plain, plus the least claim of each batch's
//     keys: one INSERT … ON CONFLICT DO NOTHING of a row per message holding
//     a scope code and the UUIDv7 ID (the primary key), the payload's
//     SHA-256 and an expiry, no index besides the key. It bounds what any
//     store that keeps a row per key can reach on the machine;
//   - batch-dedupe-v7-vs-floor: batch-dedupe-v7 and batch-floor-v7 in turn,
//     each iteration one run of each, reported as both rates and their
//     ratio (x-floor; the target is 0.95 or more), side by side as the
//     machine's load moves.
//
// Events go to the outbox in every mode (no relay runs). Run:
//
//	go test -run '^$' -bench Throughput -benchtime 3x ./examples/ledger-consumer/ledger
func BenchmarkThroughput(b *testing.B) { benchBatchThroughput(b) }

func benchBatchThroughput(b *testing.B) {
	for _, mode := range []struct {
		name string
		p    pipeline
	}{
		{"per-message-dedupe", pipeline{}},
		{"batch-dedupe", pipeline{batch: true}},
		{"batch-plain", pipeline{batch: true, noDedupe: true}},
		{"batch-dedupe-v7", pipeline{batch: true, v7: true}},
		{"batch-dedupe-single-table", pipeline{batch: true, layout: pgstore.LayoutSingleTable}},
		{"batch-dedupe-v7-single-table", pipeline{batch: true, v7: true, layout: pgstore.LayoutSingleTable}},
		{"batch-floor-v7", batchFloorV7},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				total += throughputRun(b, mode.p, 0, nil)
			}
			b.ReportMetric(float64(throughputMessages*b.N)/total.Seconds(), "msgs/s")
		})
	}
	b.Run("batch-dedupe-v7-vs-floor", func(b *testing.B) {
		var dedupe, floor time.Duration
		for i := range b.N {
			// In turn, the first of each pair swapped each time, so that
			// what one run leaves behind (a checkpoint, autovacuum) falls
			// on both sides.
			if i%2 == 0 {
				dedupe += throughputRun(b, pipeline{batch: true, v7: true}, 0, nil)
				floor += throughputRun(b, batchFloorV7, 0, nil)
			} else {
				floor += throughputRun(b, batchFloorV7, 0, nil)
				dedupe += throughputRun(b, pipeline{batch: true, v7: true}, 0, nil)
			}
		}
		b.ReportMetric(float64(throughputMessages*b.N)/dedupe.Seconds(), "dedupe-msgs/s")
		b.ReportMetric(float64(throughputMessages*b.N)/floor.Seconds(), "floor-msgs/s")
		b.ReportMetric(floor.Seconds()/dedupe.Seconds(), "x-floor")
	})
}

// batchFloorV7 is the batch pipeline with the least claim a row-per-key
// store can make, over time-ordered IDs.
var batchFloorV7 = pipeline{batch: true, noDedupe: true, v7: true, floor: true}

// BenchmarkLatency measures each message's end-to-end latency, from the
// producer's write call to the hook that runs after its transaction
// committed, while throughputMessages topups are produced at a fixed rate,
// every 10ms: LATENCY_RATE_PER_MESSAGE (default 500/s) through the
// per-message pipeline and LATENCY_RATE_BATCH (default 12 000/s) through the
// batch pipeline, about half of each one's maximum on the 2-core machine
// where BenchmarkThroughput was measured. Run:
//
//	go test -run '^$' -bench Latency -benchtime 1x ./examples/ledger-consumer/ledger
func BenchmarkLatency(b *testing.B) {
	for _, mode := range []struct {
		name  string
		batch bool
		rate  int
	}{
		{"per-message-dedupe", false, envInt("LATENCY_RATE_PER_MESSAGE", 500)},
		{"batch-dedupe", true, envInt("LATENCY_RATE_BATCH", 12000)},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var lat []time.Duration
			for range b.N {
				throughputRun(b, pipeline{batch: mode.batch}, mode.rate, &lat)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(mode.rate), "rate-msgs/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// benchHooks counts the messages handled and notes when the first was, and
// with sent each one's latency since it was produced.
type benchHooks struct {
	done  atomic.Int64
	first atomic.Int64
	sent  *sync.Map // command id → time.Time
	mu    sync.Mutex
	lat   []time.Duration
}

func (h *benchHooks) OnMessage(_ context.Context, ev consumer.Event) {
	if ev.Outcome != consumer.OutcomeApplied && ev.Outcome != consumer.OutcomeDuplicate {
		return
	}
	now := time.Now()
	h.first.CompareAndSwap(0, now.Add(-ev.Duration).UnixNano())
	h.done.Add(1)
	if h.sent != nil {
		if t, ok := h.sent.Load(ev.Key); ok {
			h.mu.Lock()
			h.lat = append(h.lat, now.Sub(t.(time.Time)))
			h.mu.Unlock()
		}
	}
}

// pipeline is what a throughput run consumes with: the batch consumer
// (else a router, one transaction per message), with or without the claim,
// over time-ordered command IDs (v7, else random ones), on a key layout;
// floor writes each batch's keys to a table of their own, the least claim,
// before the batch handler runs.
type pipeline struct {
	batch, noDedupe, v7, floor bool
	layout                     pgstore.Layout
}

// throughputRun consumes throughputMessages topups with the pipeline p and
// returns how long they took from the first one handled. With rate > 0 the
// topups are produced at that rate while the pipeline runs, and their
// latencies are appended to lat.
func throughputRun(b *testing.B, p pipeline, rate int, lat *[]time.Duration) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	brokers := kafkatest.Brokers(b)
	db := pgtest.NewEmpty(b)
	if err := migrations.Migrate(ctx, db.Pool, &migrations.Config{Schema: db.Schema}); err != nil {
		b.Fatal(err)
	}
	if err := Setup(ctx, db.Pool, db.Schema); err != nil {
		b.Fatal(err)
	}
	topic, events, dlq := kafkatest.Topic(b, 6), kafkatest.Topic(b, 1), kafkatest.Topic(b, 1)
	recs := make([]kafka.Message, throughputMessages)
	for i := range recs {
		id := watermill.NewUUID()
		if p.v7 {
			id = uuid.Must(uuid.NewV7()).String()
		}
		c := Command{CommandID: id, Type: Topup, Account: fmt.Sprintf("acc-%03d", i%throughputAccounts), Amount: 1}
		payload, _ := json.Marshal(c)
		recs[i] = kafka.Message{Key: []byte(c.Account), Value: payload, Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(c.CommandID)}}}
	}
	if rate == 0 {
		if err := Produce(ctx, brokers, topic, recs); err != nil {
			b.Fatal(err)
		}
	}
	w, err := NewWorker(db.Pool, Config{Schema: db.Schema, Brokers: brokers, Commands: topic, Events: events, DeadLetter: dlq,
		Group: kafkatest.Name("g"), NoDedupe: p.noDedupe, KeyLayout: p.layout, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	hooks := &benchHooks{}
	if rate > 0 {
		hooks.sent = &sync.Map{}
	}
	log := slog.New(slog.DiscardHandler)
	window := 1
	if p.batch {
		window = throughputBatchSize
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Name("g"),
		MaxInFlight: window, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	store := w.store
	if err := store.Check(ctx); err != nil {
		b.Fatal(err)
	}
	handler := w.handleBatch
	if p.floor {
		if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("floor_keys")+
			" (scope smallint, kid uuid, fingerprint bytea NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (scope, kid))"); err != nil {
			b.Fatal(err)
		}
		insert := "INSERT INTO " + db.Table("floor_keys") + " (scope, kid, fingerprint, expires_at) " +
			"SELECT 1, kid, fp, now() + interval '7 days' FROM unnest($1::uuid[], $2::bytea[]) AS u(kid, fp) ON CONFLICT DO NOTHING"
		handler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			ids, fps := make([]string, len(msgs)), make([][]byte, len(msgs))
			for i, m := range msgs {
				fp := sha256.Sum256(m.Payload)
				ids[i], fps[i] = m.UUID, fp[:]
			}
			if _, err := tx.Exec(ctx, insert, ids, fps); err != nil {
				return nil, err
			}
			return w.handleBatch(ctx, tx, msgs)
		}
	}
	if p.batch {
		var keys consumer.BatchStore = store
		if p.noDedupe {
			keys = measure.NoDedupeStore(store)
		}
		bc, err := consumer.NewBatchConsumer(keys, handler, &consumer.BatchConfig{
			Config:          consumer.Config{Scope: Scope, Outputs: w.writer.Outputs(events), Hooks: hooks, Logger: log},
			MaxSize:         throughputBatchSize,
			Publisher:       pub,
			DeadLetterTopic: dlq,
			Workers:         benchWorkers(),
		})
		if err != nil {
			b.Fatal(err)
		}
		go func() { done <- bc.Subscribe(runCtx, sub, topic) }()
	} else {
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NewSlogLogger(log))
		if err != nil {
			b.Fatal(err)
		}
		mw, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: Scope, Outputs: w.writer.Outputs(events), Hooks: hooks, Logger: log})
		if err != nil {
			b.Fatal(err)
		}
		poison, err := middleware.PoisonQueueWithFilter(pub, dlq, dedupe.IsPermanent)
		if err != nil {
			b.Fatal(err)
		}
		retry := middleware.Retry{MaxRetries: 3, InitialInterval: 50 * time.Millisecond, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
		router.AddMiddleware(poison, retry.Middleware, middleware.Timeout(30*time.Second), mw.Middleware, middleware.Recoverer)
		router.AddHandler(Scope, topic, sub, events, pub, consumer.TxHandler(w.handle))
		go func() { done <- router.Run(runCtx) }()
	}
	if rate > 0 {
		go paced(runCtx, b, brokers, topic, recs, rate, hooks.sent)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for hooks.done.Load() < throughputMessages {
		select {
		case err := <-done:
			b.Fatalf("the pipeline stopped after %d messages: %v", hooks.done.Load(), err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages after 10 minutes", hooks.done.Load(), throughputMessages)
		}
	}
	elapsed := time.Since(time.Unix(0, hooks.first.Load()))
	stop()
	<-done
	var applied int64
	if err := db.Pool.QueryRow(ctx, "SELECT coalesce(sum(available), 0) FROM "+db.Table("accounts")).Scan(&applied); err != nil {
		b.Fatal(err)
	}
	if applied != throughputMessages {
		b.Fatalf("balances sum to %d, want %d", applied, throughputMessages)
	}
	if lat != nil {
		*lat = append(*lat, hooks.lat...)
	}
	return elapsed
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchWorkers is the batch consumer's Workers: BATCH_WORKERS, or
// batchWorkers (the worker's own) when unset.
func benchWorkers() int {
	return envInt("BATCH_WORKERS", batchWorkers)
}

// paced produces recs at rate messages per second, in slices every 10ms,
// noting when each was handed to the producer.
func paced(ctx context.Context, b *testing.B, brokers []string, topic string, recs []kafka.Message, rate int, sent *sync.Map) {
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	defer wr.Close()
	per := max(rate/100, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < len(recs); i += per {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		end := min(i+per, len(recs))
		now := time.Now()
		for _, r := range recs[i:end] {
			sent.Store(string(r.Headers[0].Value), now)
		}
		if err := wr.WriteMessages(ctx, recs[i:end]...); err != nil && ctx.Err() == nil {
			b.Errorf("produce: %v", err)
			return
		}
	}
}

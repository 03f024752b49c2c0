package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// world is a small ledger consumed from Kafka: each command adds an amount
// to an account. Every application of a command is counted, so a double
// application shows up as a count of 2 (and a wrong balance).
type world struct {
	t          testing.TB
	db         *pgtest.DB
	store      *pgstore.Store
	brokers    []string
	topic      string
	dlq        string
	out        string
	partitions int
	pub        *kafkapubsub.Publisher
}

type command struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func newWorld(t testing.TB, partitions int) *world {
	t.Helper()
	return newWorldOn(t, kafkatest.Brokers(t), partitions)
}

// newWorldOn is newWorld on the given brokers.
func newWorldOn(t testing.TB, brokers []string, partitions int) *world {
	t.Helper()
	w := &world{t: t, db: pgtest.New(t), brokers: brokers, partitions: partitions}
	ctx := context.Background()
	if _, err := w.db.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE %s (account text PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE %s (uuid text PRIMARY KEY, n int NOT NULL);`,
		w.db.Table("balances"), w.db.Table("applications"))); err != nil {
		t.Fatal(err)
	}
	w.useStore(w.db.Pool)
	w.topic, w.dlq, w.out = kafkatest.Name("t"), kafkatest.Name("dlq"), kafkatest.Name("out")
	kafkatest.CreateTopicOn(t, brokers, w.topic, partitions)
	kafkatest.CreateTopicOn(t, brokers, w.dlq, 1)
	kafkatest.CreateTopicOn(t, brokers, w.out, 1)
	var err error
	w.pub, err = kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.brokers, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.pub.Close() })
	return w
}

// useStore points the middleware's store at pool.
func (w *world) useStore(pool *pgxpool.Pool) {
	store, err := pgstore.New(pool, &pgstore.Config{Schema: w.db.Schema, RetryBackoff: 5 * time.Millisecond})
	if err != nil {
		w.t.Fatal(err)
	}
	w.store = store
}

// apply is the handler's effect, in the middleware's transaction.
func (w *world) apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var c command
	if err := json.Unmarshal(msg.Payload, &c); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("balances")+" (account, balance) VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET balance = "+w.db.Table("balances")+".balance + excluded.balance", c.Account, c.Amount); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("applications")+" (uuid, n) VALUES ($1, 1) ON CONFLICT (uuid) DO UPDATE SET n = "+w.db.Table("applications")+".n + 1", msg.UUID)
	return err
}

// handler applies the command and emits one event whose UUID is new on
// every run (so a re-published stored event is recognisable).
func (w *world) handler(fail func(msg *message.Message) error) message.HandlerFunc {
	return consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if err := w.apply(ctx, tx, msg); err != nil {
			return nil, err
		}
		if fail != nil {
			if err := fail(msg); err != nil {
				return nil, err // after the writes: the rollback must undo them
			}
		}
		ev := message.NewMessage(watermill.NewUUID(), []byte(`{"applied":"`+msg.UUID+`"}`))
		return []*message.Message{ev}, nil
	})
}

type routerOpts struct {
	group   string
	cfg     *consumer.Config
	handler message.HandlerFunc
	// outer wraps everything, outside the dedupe middleware.
	outer message.HandlerMiddleware
	hooks *countingHooks
	// logger is the middleware's; defaults to quietLogger().
	logger *slog.Logger
	// chain replaces the recommended middleware chain.
	chain func(c chain) []message.HandlerMiddleware
}

// chain holds the middleware that startRouter builds, to be put in order.
type chain struct {
	poison, retry, timeout, dedupe, recoverer message.HandlerMiddleware
}

type countingHooks struct {
	mu sync.Mutex
	n  map[consumer.Outcome]int
}

func (h *countingHooks) OnMessage(_ context.Context, ev consumer.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[consumer.Outcome]int{}
	}
	h.n[ev.Outcome]++
}

func (h *countingHooks) get(o consumer.Outcome) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[o]
}

// startRouter runs a Watermill router with the recommended middleware
// order: PoisonQueue (permanent errors to the DLQ), Retry (not of permanent
// errors, with ResetContextOnRetry), Timeout, the dedupe middleware,
// Recoverer. It returns a stop function.
func (w *world) startRouter(o routerOpts) (stop func()) {
	t := w.t
	t.Helper()
	logger := watermill.NewSlogLogger(quietLogger())
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: w.brokers, ConsumerGroup: o.group, NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, DrainTimeout: 5 * time.Second,
		Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &consumer.Config{Scope: "ledger"}
	if o.cfg != nil {
		cfg = o.cfg
	}
	if o.hooks != nil {
		cfg.Hooks = o.hooks
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if o.logger != nil {
		cfg.Logger = o.logger
	}
	mw, err := consumer.NewMiddleware(w.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(w.pub, w.dlq, dedupe.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
	h := o.handler
	if h == nil {
		h = w.handler(nil)
	}
	if o.outer != nil {
		r.AddMiddleware(o.outer)
	}
	if o.chain != nil {
		r.AddMiddleware(o.chain(chain{poison: poison, retry: retry.Middleware, timeout: middleware.Timeout(time.Second),
			dedupe: mw.Middleware, recoverer: middleware.Recoverer})...)
	} else {
		r.AddMiddleware(poison, retry.Middleware, middleware.Timeout(time.Second), mw.Middleware, middleware.Recoverer)
	}
	// The router closes a handler's publisher when it stops: each router
	// gets its own.
	out, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.brokers, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r.AddHandler("ledger", w.topic, sub, w.out, out, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	select {
	case <-r.Running():
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = sub.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// produce writes records straight with kafka-go (so tests control headers).
func (w *world) produce(records ...kafka.Message) {
	w.t.Helper()
	wr := &kafka.Writer{Addr: kafka.TCP(w.brokers...), Topic: w.topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 500}
	defer wr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := wr.WriteMessages(ctx, records...); err != nil {
		w.t.Fatal(err)
	}
}

// record makes a command record with the Watermill UUID header.
func record(uuid, account string, amount int64) kafka.Message {
	payload, _ := json.Marshal(command{Account: account, Amount: amount})
	m := kafka.Message{Key: []byte(account), Value: payload}
	if uuid != "" {
		m.Headers = []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(uuid)}}
	}
	return m
}

func (w *world) count(query string, args ...any) int {
	w.t.Helper()
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *world) applied() int {
	return w.count("SELECT count(*) FROM " + w.db.Table("applications"))
}

// waitCaughtUp waits until the group's committed offsets reach the end of
// the topic: every record was acked.
func (w *world) waitCaughtUp(group string, d time.Duration) {
	w.t.Helper()
	end := kafkatest.EndOffsetsOn(w.t, w.brokers, w.topic, w.partitions)
	testenv.WaitFor(w.t, d, "group "+group+" to commit up to "+fmt.Sprint(end), func() bool {
		got := kafkatest.CommittedOffsetsOn(w.t, w.brokers, group, w.topic, w.partitions)
		for p, o := range end {
			if got[p] != o {
				return false
			}
		}
		return true
	})
}

// assertExactlyOnce checks Postgres: each expected UUID applied once, no
// other applied, and the balances equal the sums of the expected commands.
func (w *world) assertExactlyOnce(expected map[string]command) {
	w.t.Helper()
	ctx := context.Background()
	rows, err := w.db.Pool.Query(ctx, "SELECT uuid, n FROM "+w.db.Table("applications"))
	if err != nil {
		w.t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var u string
		var n int
		if err := rows.Scan(&u, &n); err != nil {
			w.t.Fatal(err)
		}
		got[u] = n
	}
	for u := range expected {
		if got[u] != 1 {
			w.t.Errorf("command %s applied %d times, want 1", u, got[u])
		}
	}
	for u, n := range got {
		if _, ok := expected[u]; !ok {
			w.t.Errorf("unexpected command %s applied %d times", u, n)
		}
	}
	want := map[string]int64{}
	for _, c := range expected {
		want[c.Account] += c.Amount
	}
	rows, err = w.db.Pool.Query(ctx, "SELECT account, balance FROM "+w.db.Table("balances"))
	if err != nil {
		w.t.Fatal(err)
	}
	for rows.Next() {
		var a string
		var b int64
		if err := rows.Scan(&a, &b); err != nil {
			w.t.Fatal(err)
		}
		if want[a] != b {
			w.t.Errorf("account %s balance %d, want %d", a, b, want[a])
		}
		delete(want, a)
	}
	for a, b := range want {
		w.t.Errorf("account %s missing, want balance %d", a, b)
	}
}

// commands makes n distinct commands over a few accounts.
func commands(n int) (map[string]command, []kafka.Message) {
	exp := map[string]command{}
	var recs []kafka.Message
	for i := 0; i < n; i++ {
		u := watermill.NewUUID()
		c := command{Account: fmt.Sprint("acc-", i%13), Amount: int64(i%7 + 1)}
		exp[u] = c
		recs = append(recs, record(u, c.Account, c.Amount))
	}
	return exp, recs
}

// readTopic reads every record of a one-partition topic up to its end.
// Whatever a handler publishes is on Kafka before its message is acked, so
// after waitCaughtUp the end offsets are final.
func (w *world) readTopic(topic string) []kafka.Message {
	return kafkatest.ReadAllOn(w.t, w.brokers, topic, 1, time.Minute)
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func quietLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

func quiet() *slog.Logger {
	if os.Getenv("EXACTLY_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type event struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

type fixture struct {
	db     *pgtest.DB
	w      *outbox.Writer
	topic  string
	parts  int
	pub    *kafkapubsub.Publisher
	mu     sync.Mutex
	wanted map[string]event // committed messages by UUID
	seq    map[string]int   // last committed sequence number per key
}

func newFixture(t testing.TB, parts int) *fixture {
	f := &fixture{db: pgtest.New(t), topic: kafkatest.Topic(t, parts), parts: parts, wanted: map[string]event{}, seq: map[string]int{}}
	var err error
	if f.w, err = outbox.NewWriter(&outbox.Config{Schema: f.db.Schema}); err != nil {
		t.Fatal(err)
	}
	if f.pub, err = kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: kafkatest.Brokers(t), Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.pub.Close() })
	return f
}

func (f *fixture) relay(t testing.TB, pub message.Publisher, cfg *outbox.RelayConfig) *outbox.Relay {
	c := outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, Logger: quiet()}
	if cfg != nil {
		c = *cfg
	}
	c.Config.Schema = f.db.Schema
	if c.Logger == nil {
		c.Logger = quiet()
	}
	r, err := outbox.NewRelay(f.db.Pool, pub, &c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// write writes txs transactions of perTx messages over keys; a tenth of the
// transactions roll back. Sequence numbers per key follow write order.
func (f *fixture) write(t *testing.T, txs, perTx, keys int) {
	ctx := context.Background()
	seq := f.seq
	for i := 0; i < txs; i++ {
		tx, err := f.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rollback := rand.IntN(10) == 0
		batch := map[string]event{}
		var msgs []*message.Message
		local := map[string]int{}
		for j := 0; j < perTx; j++ {
			k := fmt.Sprint("key-", rand.IntN(keys))
			local[k]++
			ev := event{Key: k, Seq: seq[k] + local[k]}
			payload, _ := json.Marshal(ev)
			m := message.NewMessage(watermill.NewUUID(), payload)
			m.Metadata.Set(outbox.KeyMetadata, k)
			msgs = append(msgs, m)
			batch[m.UUID] = ev
		}
		if err := f.w.WriteTx(ctx, tx, f.topic, msgs...); err != nil {
			t.Fatal(err)
		}
		if rollback {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for k, n := range local {
			seq[k] += n
		}
		f.mu.Lock()
		for u, ev := range batch {
			f.wanted[u] = ev
		}
		f.mu.Unlock()
	}
}

func (f *fixture) pending(t testing.TB) int {
	var n int
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.db.Table("exactly_outbox")+" WHERE status = 'PENDING'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// check reads the topic and verifies: every committed message is there,
// nothing else, each key in order; dups counts re-sent copies (same UUID).
func (f *fixture) check(t *testing.T, allowDuplicates bool) (dups int) {
	got := kafkatest.ReadAll(t, f.topic, f.parts, time.Minute)
	seen := map[string]int{}
	last := map[string]int{}
	for _, m := range got {
		var u string
		for _, h := range m.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				u = string(h.Value)
			}
		}
		want, ok := f.wanted[u]
		if !ok {
			t.Fatalf("message %s on Kafka was never committed (payload %s)", u, m.Value)
		}
		var ev event
		if err := json.Unmarshal(m.Value, &ev); err != nil || ev != want || string(m.Key) != want.Key {
			t.Fatalf("message %s: key %s payload %s, want %+v", u, m.Key, m.Value, want)
		}
		seen[u]++
		if seen[u] > 1 {
			dups++
			continue // a re-sent copy; its first copy was checked for order
		}
		if ev.Seq <= last[ev.Key] {
			t.Fatalf("key %s out of order: seq %d after %d", ev.Key, ev.Seq, last[ev.Key])
		}
		last[ev.Key] = ev.Seq
	}
	if len(seen) != len(f.wanted) {
		t.Fatalf("%d of %d committed messages reached Kafka", len(seen), len(f.wanted))
	}
	if dups > 0 && !allowDuplicates {
		t.Fatalf("%d duplicates", dups)
	}
	return dups
}

// 10 000 messages in 200 transactions, some rolled back: exactly the
// committed ones reach Kafka, in per-key order.
func TestCommittedOnlyInKeyOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	f.write(t, 200, 50, 40)
	r := f.relay(t, f.pub, &outbox.RelayConfig{BatchSize: 500, PollInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.WaitFor(t, 2*time.Minute, "the outbox to drain", func() bool { return f.pending(t) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.check(t, false)
	st, err := r.Stats(context.Background())
	if err != nil || st.Pending != 0 || st.Dead != 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

// crashingPublisher publishes, then "kills" its relay after n publishes:
// the batch's rows are on Kafka but not marked.
type crashingPublisher struct {
	message.Publisher
	left  atomic.Int64
	crash func()
}

func (c *crashingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := c.Publisher.Publish(topic, msgs...)
	if c.left.Add(-1) == 0 {
		c.crash()
		return errors.New("relay killed")
	}
	return err
}

// The relay killed mid-batch and restarted: nothing lost; re-sent messages
// carry their original UUIDs.
func TestRelayKilledMidBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	f.write(t, 40, 25, 10)
	ctx, kill := context.WithCancel(context.Background())
	cp := &crashingPublisher{Publisher: f.pub, crash: kill}
	cp.left.Store(3)
	r := f.relay(t, cp, &outbox.RelayConfig{BatchSize: 50})
	_ = r.Run(ctx) // returns once killed
	if left := f.pending(t); left == 0 {
		t.Fatal("the kill came too late: nothing left pending")
	}
	r2 := f.relay(t, f.pub, nil)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go r2.Run(ctx2)
	testenv.WaitFor(t, 2*time.Minute, "the outbox to drain", func() bool { return f.pending(t) == 0 })
	if dups := f.check(t, true); dups == 0 {
		t.Fatal("the killed batch was not re-sent: the test did not kill mid-batch")
	}
}

// Two relays at once: nothing lost, nothing sent twice, per-key order kept.
func TestTwoRelays(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	f.write(t, 100, 30, 25) // a backlog both relays start on at once
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var published [2]atomic.Int64
	for i := range 2 {
		r := f.relay(t, f.pub, &outbox.RelayConfig{BatchSize: 5, PollInterval: 20 * time.Millisecond,
			Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) { published[i].Add(int64(ev.Published)) })})
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	f.write(t, 50, 30, 25) // and more written while they run
	testenv.WaitFor(t, 2*time.Minute, "the outbox to drain", func() bool { return f.pending(t) == 0 })
	cancel()
	wg.Wait()
	f.check(t, false)
	if published[0].Load() == 0 || published[1].Load() == 0 {
		t.Errorf("one relay did all the work: %d and %d", published[0].Load(), published[1].Load())
	}
}

// A message the broker rejects (over its size limit) is retried with
// back-off, counted, moved to DEAD after MaxAttempts, and never holds up
// other keys.
func TestRejectedMessageGoesDead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	huge := message.NewMessage(watermill.NewUUID(), []byte(strings.Repeat("x", 2<<20)))
	huge.Metadata.Set(outbox.KeyMetadata, "bad")
	if err := f.w.WriteTx(ctx, tx, f.topic, huge); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.write(t, 10, 10, 5)
	var failed, dead atomic.Int64
	r := f.relay(t, f.pub, &outbox.RelayConfig{MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) { failed.Add(int64(ev.Failed)); dead.Add(int64(ev.Dead)) })})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	testenv.WaitFor(t, time.Minute, "the rejected message to go DEAD", func() bool {
		st, err := r.Stats(ctx)
		return err == nil && st.Dead == 1 && st.Pending == 0
	})
	cancel()
	f.check(t, false)
	var attempts int
	var lastErr string
	if err := f.db.Pool.QueryRow(ctx, "SELECT attempts, last_error FROM "+f.db.Table("exactly_outbox")+" WHERE status = 'DEAD'").Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 || lastErr == "" || failed.Load() != 3 || dead.Load() != 1 {
		t.Fatalf("attempts %d, last error %q, failures %d, dead %d", attempts, lastErr, failed.Load(), dead.Load())
	}
}

// The dedupe middleware writes a handler's outputs into the outbox in the
// handler's transaction; a redelivered command writes nothing more.
func TestMiddlewareOutputsThroughOutbox(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	commands := kafkatest.Topic(t, 2)
	brokers := kafkatest.Brokers(t)
	store, err := pgstore.New(f.db.Pool, &pgstore.Config{Schema: f.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "emitter", Outputs: f.w.Outputs(f.topic), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// 50 commands, each produced twice with the same UUID.
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: commands, RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	var recs []kafka.Message
	for i := 0; i < 50; i++ {
		u := watermill.NewUUID()
		rec := kafka.Message{Key: []byte(fmt.Sprint("k", i%5)), Value: []byte(fmt.Sprint(i)), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(u)}}}
		recs = append(recs, rec, rec)
	}
	if err := wr.WriteMessages(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	wr.Close()
	var mu sync.Mutex
	emitted := map[string]string{} // event UUID -> command payload
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	group := kafkatest.Name("g")
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	handled := atomic.Int64{}
	router.AddConsumerHandler("emitter", commands, sub, func(*message.Message) error {
		handled.Add(1)
		return nil
	}).AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if _, err := h(msg); err != nil {
				return nil, err
			}
			ev := message.NewMessage(watermill.NewUUID(), []byte("event for "+string(msg.Payload)))
			ev.Metadata.Set(outbox.KeyMetadata, msg.Metadata.Get(kafkapubsub.MetadataKafkaKey))
			mu.Lock()
			emitted[ev.UUID] = string(msg.Payload)
			mu.Unlock()
			return []*message.Message{ev}, nil
		})
	})
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go router.Run(rctx)
	r := f.relay(t, f.pub, nil)
	go r.Run(rctx)
	end := kafkatest.EndOffsets(t, commands, 2)
	testenv.WaitFor(t, time.Minute, "every delivery to be acked", func() bool {
		got := kafkatest.CommittedOffsets(t, group, commands, 2)
		return got[0] == end[0] && got[1] == end[1]
	})
	if n := handled.Load(); n != 50 {
		t.Fatalf("handler ran %d times for 50 commands delivered twice", n)
	}
	testenv.WaitFor(t, time.Minute, "the outbox to drain", func() bool {
		var n int
		_ = f.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.db.Table("exactly_outbox")+" WHERE status = 'PUBLISHED'").Scan(&n)
		return n == 50 && f.pending(t) == 0
	})
	got := kafkatest.ReadAll(t, f.topic, 1, time.Minute)
	if len(got) != 50 {
		t.Fatalf("%d events on Kafka, want 50 (one per command)", len(got))
	}
	for _, m := range got {
		var u string
		for _, h := range m.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				u = string(h.Value)
			}
		}
		mu.Lock()
		cmd, ok := emitted[u]
		mu.Unlock()
		if !ok || string(m.Value) != "event for "+cmd {
			t.Fatalf("event %s %q was not emitted by a committed run", u, m.Value)
		}
	}
}

// Published rows are kept for PublishedRetention, then deleted by Cleanup;
// pending and dead rows are never deleted.
func TestCleanupOfPublishedRows(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.write(t, 5, 4, 3)
	ctx := context.Background()
	r := f.relay(t, f.pub, &outbox.RelayConfig{PublishedRetention: time.Hour})
	for f.pending(t) > 0 {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := r.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("Cleanup within the retention deleted %d (%v)", n, err)
	}
	if _, err := f.db.Pool.Exec(ctx, "UPDATE "+f.db.Table("exactly_outbox")+" SET published_at = now() - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	// One more pending row that must survive.
	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.w.WriteTx(ctx, tx, f.topic, message.NewMessage(watermill.NewUUID(), []byte("later"))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := r.Cleanup(ctx)
	if err != nil || int(n) != len(f.wanted) {
		t.Fatalf("Cleanup deleted %d (%v), want the %d published rows", n, err, len(f.wanted))
	}
	if f.pending(t) != 1 {
		t.Fatal("cleanup deleted a pending row")
	}
}

// startRelay runs a relay on a pool of its own, whose connections carry
// the returned application_name.
func (f *fixture) startRelay(t *testing.T, poll time.Duration) (app string) {
	t.Helper()
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgtest.Config(url)
	if err != nil {
		t.Fatal(err)
	}
	app = "relay-" + f.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(pool, f.pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema}, PollInterval: poll, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the relay stopped: cleanups run last first
	runRelay(t, r)
	return app
}

// runRelay runs r until t ends, and fails t if Run returns an error.
func runRelay(t *testing.T, r *outbox.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// waitIdle waits until the relay named app listens for notifications with
// nothing left to publish.
func (f *fixture) waitIdle(t *testing.T, app string) {
	t.Helper()
	// Idle: it listens, and none of its connections ran a statement for
	// 300 ms (a pass runs them back to back).
	testenv.WaitFor(t, 10*time.Second, "the relay to listen and sleep", func() bool {
		var listening, busy int
		err := f.db.Pool.QueryRow(context.Background(), `SELECT
    count(*) FILTER (WHERE query = 'LISTEN exactly_outbox'),
    count(*) FILTER (WHERE state <> 'idle' OR clock_timestamp() - state_change < interval '300 ms')
FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&listening, &busy)
		return err == nil && listening == 1 && busy == 0
	})
}

// A relay that sleeps with an hour's poll floor publishes a committed
// message at once: the insert's NOTIFY wakes it.
func TestNotifyWakesIdleRelay(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	f.waitIdle(t, f.startRelay(t, time.Hour))
	for len(f.wanted) == 0 { // f.write rolls some transactions back
		f.write(t, 5, 3, 4)
	}
	testenv.WaitFor(t, 10*time.Second, "the notified relay to publish", func() bool { return f.pending(t) == 0 })
	f.check(t, false)
}

// With the NOTIFY trigger disabled the relay still publishes everything, on
// its poll floor: notifications only wake it.
func TestRelayPollsWithoutNotify(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	if _, err := f.db.Pool.Exec(context.Background(), "ALTER TABLE "+f.db.Table("exactly_outbox")+" DISABLE TRIGGER exactly_outbox_notify"); err != nil {
		t.Fatal(err)
	}
	f.startRelay(t, 100*time.Millisecond)
	f.write(t, 20, 3, 4)
	testenv.WaitFor(t, 30*time.Second, "the polling relay to publish", func() bool { return f.pending(t) == 0 })
	f.check(t, false)
}

// notifiedWithin listens on a connection of its own while write runs, and
// reports whether this test's outbox notified within d.
func (f *fixture) notifiedWithin(t *testing.T, d time.Duration, write func()) bool {
	t.Helper()
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "LISTEN exactly_outbox"); err != nil {
		t.Fatal(err)
	}
	write()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return false
		}
		if n.Payload == f.db.Schema+".exactly_outbox" { // other tests' outboxes share the channel
			return true
		}
	}
}

// Producers notify only while a relay is registered as sleeping, and not
// for a registration that expired.
func TestNotifyOnlyWhileARelayWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	waiters := f.db.Table("exactly_outbox_waiters")
	exec := func(sql string) {
		if _, err := f.db.Pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	write := func() { // one committed transaction (f.write rolls some back)
		ctx := context.Background()
		tx, err := f.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		msgs := []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("a")), message.NewMessage(watermill.NewUUID(), []byte("b"))}
		if err := f.w.WriteTx(ctx, tx, f.topic, msgs...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.notifiedWithin(t, 300*time.Millisecond, write) {
		t.Error("a commit notified with no relay waiting")
	}
	exec("INSERT INTO " + waiters + " VALUES ('r1', now() + interval '1 minute')")
	if !f.notifiedWithin(t, 10*time.Second, write) {
		t.Error("a commit did not notify while a relay waits")
	}
	exec("UPDATE " + waiters + " SET expires_at = now() - interval '1 second'")
	if f.notifiedWithin(t, 300*time.Millisecond, write) {
		t.Error("a commit notified for an expired registration")
	}
}

// A relay started on an outbox migrated only to 00002 (every insert
// notifies) publishes, and registers as a waiter once migration 00003
// lands while it runs.
func TestRelayAcrossWaitersMigration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	opts := &migrations.Config{Schema: f.db.Schema, Version: 2}
	if err := migrations.Down(ctx, f.db.Pool, opts); err != nil {
		t.Fatal(err)
	}
	f.startRelay(t, 200*time.Millisecond)
	for len(f.wanted) == 0 {
		f.write(t, 5, 3, 4)
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to publish on 00002", func() bool { return f.pending(t) == 0 })
	if err := migrations.Migrate(ctx, f.db.Pool, &migrations.Config{Schema: f.db.Schema}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the relay to register as a waiter", func() bool {
		var n int
		err := f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+f.db.Table("exactly_outbox_waiters")).Scan(&n)
		return err == nil && n == 1
	})
	f.write(t, 5, 3, 4)
	testenv.WaitFor(t, 10*time.Second, "the relay to publish on 00003", func() bool { return f.pending(t) == 0 })
	f.check(t, false)
}

// A relay's registration as a waiter does not outlive it, whatever cuts the
// statement short on the client while the server goes on to commit it (a
// commit under way, a synchronous standby that stalls): stopped while
// registering, the relay lets the statement finish and then removes it;
// cut by StatementTimeout, the relay waits for the server process that ran
// it to end and then deletes what it may have left.
func TestRegistrationCutShortLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		slow    string        // how long the registration takes on the server
		timeout time.Duration // StatementTimeout (0: the default)
		stopIn  time.Duration // from the registration seen under way
	}{
		{"stopped while registering", "2 seconds", 0, 0},
		{"registration timed out, then stopped", "1.5 seconds", 300 * time.Millisecond, 600 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 1)
			ctx := context.Background()
			waiters := f.db.Table("exactly_outbox_waiters")
			slow := pgx.Identifier{f.db.Schema, "slow_register"}.Sanitize()
			for _, sql := range []string{
				// A registration that a cancel request does not stop, as
				// one whose commit is under way.
				"CREATE FUNCTION " + slow + "() RETURNS trigger LANGUAGE plpgsql AS $$\n" +
					"DECLARE t0 timestamptz := clock_timestamp(); BEGIN\n" +
					"WHILE clock_timestamp() < t0 + interval '" + c.slow + "' LOOP\n" +
					"  BEGIN PERFORM pg_sleep(0.02); EXCEPTION WHEN query_canceled THEN NULL; END;\n" +
					"END LOOP; RETURN NEW; END$$",
				"CREATE TRIGGER slow_register BEFORE INSERT ON " + waiters + " FOR EACH ROW EXECUTE FUNCTION " + slow + "()",
			} {
				if _, err := f.db.Pool.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			registering := func() bool {
				var n int
				err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE state = 'active' AND query LIKE '%INSERT INTO%'||$1||'%' AND pid <> pg_backend_pid()`, f.db.Schema).Scan(&n)
				if err != nil {
					t.Fatal(err)
				}
				return n > 0
			}
			r := f.relay(t, f.pub, &outbox.RelayConfig{PollInterval: time.Hour, StatementTimeout: c.timeout})
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			testenv.WaitFor(t, 10*time.Second, "the relay to be registering", registering)
			time.Sleep(c.stopIn)
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the registration to end on the server", func() bool { return !registering() })
			var n int
			if err := f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+waiters).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("%d waiters left after the relay stopped, want 0", n)
			}
		})
	}
}

// When Run returns, nothing of the relay goes on: no goroutine of its (the
// LISTEN connection's among them) and no open connection of its pool in
// its hands. Whoever stops a relay and then closes the pool, or checks for
// leaked goroutines, is not kept waiting, and no statement of the relay
// runs after it. Not parallel: the goroutines of the other tests' relays
// would be counted (the parallel tests start once this one is over).
func TestRunLeavesNothingRunning(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	cfg := f.db.Pool.Config().Copy()
	cfg.MaxConns = 4
	held := &heldConns{acquired: map[*pgx.Conn]bool{}}
	cfg.ConnConfig.Tracer = held
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, f.pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema},
		PollInterval: time.Hour, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	waiters := f.db.Table("exactly_outbox_waiters")
	for i := range 20 {
		f.write(t, 3, 5, 4)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		// Published, and asleep on its LISTEN connection.
		testenv.WaitFor(t, 10*time.Second, "the relay to publish and sleep", func() bool {
			var n int
			if err := f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+waiters).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1 && f.pending(t) == 0
		})
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := held.open(); n != 0 {
			t.Fatalf("run %d: the relay returned holding %d open connections, want 0", i, n)
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, l := range strings.Split(g, "\n") {
				// The goroutine that ran listen may still be on its way
				// out of the function that reported listen's end.
				if strings.HasPrefix(l, "github.com/exactly-go/exactly/outbox.(") && !strings.HasPrefix(l, "github.com/exactly-go/exactly/outbox.(*Relay).Run.func1") {
					t.Fatalf("run %d: a goroutine of the relay outlived Run:\n%s", i, g)
				}
			}
		}
	}
	f.check(t, false)
}

// heldConns counts the open connections acquired from a pool and not yet
// released.
type heldConns struct {
	mu       sync.Mutex
	acquired map[*pgx.Conn]bool
}

func (h *heldConns) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for c := range h.acquired {
		if !c.IsClosed() {
			n++
		}
	}
	return n
}

func (h *heldConns) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (h *heldConns) TraceAcquireEnd(_ context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Conn != nil {
		h.mu.Lock()
		h.acquired[d.Conn] = true
		h.mu.Unlock()
	}
}

func (h *heldConns) TraceRelease(_ *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	h.mu.Lock()
	delete(h.acquired, d.Conn)
	h.mu.Unlock()
}

func (h *heldConns) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (h *heldConns) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

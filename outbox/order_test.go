package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
)

// commitOne writes msgs for topic in one committed transaction.
func (f *fixture) commitOne(t testing.TB, topic string, msgs ...*message.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := f.w.WriteTx(ctx, tx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func keyed(key, payload string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(payload))
	m.Metadata.Set(outbox.KeyMetadata, key)
	return m
}

// status returns the outbox status of the message with uuid.
func (f *fixture) status(t testing.TB, uuid string) string {
	t.Helper()
	var s string
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT status FROM "+f.db.Table("exactly_outbox")+" WHERE uuid = $1", uuid).Scan(&s); err != nil {
		t.Fatalf("status of %s: %v", uuid, err)
	}
	return s
}

// onKafka returns the UUIDs on topic with key, in log order.
func onKafka(t testing.TB, topic string, parts int, key string) []string {
	t.Helper()
	var out []string
	for _, m := range kafkatest.ReadAll(t, topic, parts, time.Minute) {
		if string(m.Key) != key {
			continue
		}
		for _, h := range m.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				out = append(out, string(h.Value))
			}
		}
	}
	return out
}

// laneOf is the lane the writer gives key (fnv-1a mod Lanes); tests check
// it against the table.
func laneOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % outbox.Lanes)
}

// One key's m1 (300 KB), m2 (600 KB, over the topic's max.message.bytes)
// and m3 (300 KB): kafka-go would put m1 and m2 in one request and m3 in
// the next, and go on with m3 after m2's request failed. Kafka must never
// hold m3 before m1, nor m3 at all while m2 is not on Kafka: m2 goes DEAD
// and holds m3 until an operator removes it. Another key is not held up.
func TestKeyOrderWhenTheBrokerRejectsOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	res, err := kafkatest.Client(t).AlterConfigs(ctx, &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: f.topic,
		Configs: []kafka.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: "500000"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range res.Errors {
		if err != nil {
			t.Fatal(err)
		}
	}
	m1 := keyed("k", "1"+strings.Repeat("a", 300_000))
	m2 := keyed("k", "2"+strings.Repeat("b", 600_000))
	m3 := keyed("k", "3"+strings.Repeat("c", 300_000))
	f.commitOne(t, f.topic, m1, m2, m3)
	other := keyed("other", "o")
	f.commitOne(t, f.topic, other)
	r := f.relay(t, f.pub, &outbox.RelayConfig{MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond, Logger: quiet()})
	testenv.WaitFor(t, time.Minute, "m2 to go DEAD", func() bool {
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return f.status(t, m2.UUID) == "DEAD"
	})
	for range 3 { // more passes: m3 stays held
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := onKafka(t, f.topic, 1, "k"); len(got) != 1 || got[0] != m1.UUID {
		t.Fatalf("key k on Kafka: %v, want only m1 %s (m2 is DEAD, m3 held)", got, m1.UUID)
	}
	if s := f.status(t, m3.UUID); s != "PENDING" {
		t.Fatalf("m3 is %s behind a DEAD m2, want PENDING", s)
	}
	if s := f.status(t, other.UUID); s != "PUBLISHED" {
		t.Fatalf("another key's message is %s, want PUBLISHED", s)
	}
	// The operator gives up on m2: m3 follows m1.
	if _, err := f.db.Pool.Exec(ctx, "DELETE FROM "+f.db.Table("exactly_outbox")+" WHERE uuid = $1", m2.UUID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := onKafka(t, f.topic, 1, "k"); len(got) != 2 || got[0] != m1.UUID || got[1] != m3.UUID {
		t.Fatalf("key k on Kafka: %v, want m1 %s then m3 %s", got, m1.UUID, m3.UUID)
	}
}

// failingPublisher fails every message whose key is bad, counts calls,
// and notes when each message was acknowledged.
type failingPublisher struct {
	message.Publisher
	bad      string
	calls    atomic.Int64
	failures atomic.Int64
	acked    sync.Map // UUID -> time.Time
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls.Add(1)
	for _, m := range msgs {
		if m.Metadata.Get(outbox.KeyMetadata) == p.bad {
			p.failures.Add(1)
			return fmt.Errorf("test: %s is refused", m.UUID)
		}
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	for _, m := range msgs {
		p.acked.LoadOrStore(m.UUID, now)
	}
	return nil
}

// A key whose first message keeps failing, with a backlog larger than a
// batch: the relay does not spin on it (each batch publishes or fails
// something), and messages of other keys, in its lane and in others, are
// published while it fails. It reports how long those waited.
func TestFailingKeyHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	const bad = "bad"
	sameLane, otherLane := "", ""
	for i := 0; sameLane == "" || otherLane == ""; i++ {
		k := fmt.Sprint("key-", i)
		if laneOf(k) == laneOf(bad) && sameLane == "" {
			sameLane = k
		} else if laneOf(k) != laneOf(bad) && otherLane == "" {
			otherLane = k
		}
	}
	var backlog []*message.Message
	for i := range 50 {
		backlog = append(backlog, keyed(bad, fmt.Sprint("bad ", i)))
	}
	f.commitOne(t, f.topic, backlog...)
	pub := &failingPublisher{Publisher: f.pub, bad: bad}
	var batches, idle atomic.Int64
	const poll = 50 * time.Millisecond
	r := f.relay(t, pub, &outbox.RelayConfig{BatchSize: 10, PollInterval: poll, RetryBackoff: 100 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond, MaxAttempts: 1 << 20,
		Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) {
			batches.Add(1)
			if ev.Published == 0 && ev.Failed == 0 {
				idle.Add(1)
			}
		})})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, 30*time.Second, "the bad key to fail twice", func() bool { return pub.failures.Load() >= 2 })

	var mu sync.Mutex
	var waits []time.Duration
	for i := range 10 {
		key := sameLane
		if i%2 == 1 {
			key = otherLane
		}
		m := keyed(key, fmt.Sprint("good ", i))
		f.commitOne(t, f.topic, m)
		committed := time.Now()
		testenv.WaitFor(t, 30*time.Second, "a message of "+key+" to be published", func() bool { return f.status(t, m.UUID) == "PUBLISHED" })
		acked, _ := pub.acked.Load(m.UUID)
		mu.Lock()
		waits = append(waits, acked.(time.Time).Sub(committed))
		mu.Unlock()
	}
	var lanes []int
	if err := f.db.Pool.QueryRow(ctx, "SELECT array_agg(DISTINCT lane ORDER BY lane) FROM "+f.db.Table("exactly_outbox")).Scan(&lanes); err != nil || len(lanes) != 2 {
		t.Fatalf("lanes %v (%v): the test wants keys in the bad key's lane and in another", lanes, err)
	}
	// Measure the cost of the failing key over a few of its retries.
	b0, f0 := batches.Load(), pub.failures.Load()
	testenv.WaitFor(t, 30*time.Second, "the bad key to fail 5 more times", func() bool { return pub.failures.Load() >= f0+5 })
	b1, f1 := batches.Load(), pub.failures.Load()
	if n := idle.Load(); n != 0 {
		t.Errorf("%d batches neither published nor failed anything", n)
	}
	if b1-b0 > f1-f0+2 {
		t.Errorf("%d batches for %d failures of the held key", b1-b0, f1-f0)
	}
	if n := f.pending(t); n != len(backlog) {
		t.Errorf("%d pending, want the held key's %d", n, len(backlog))
	}
	if got := onKafka(t, f.topic, 2, bad); len(got) != 0 {
		t.Errorf("%d messages of the failing key on Kafka", len(got))
	}
	var worst time.Duration
	for _, w := range waits {
		worst = max(worst, w)
	}
	t.Logf("waits: %v", waits)
	t.Logf("while key %q failed: other keys' messages were acknowledged at worst %v after their commit (poll interval %v); %d batches for %d failures",
		bad, worst, poll, b1-b0, f1-f0)
}

// Which order: per key, the order in which the relay sees transactions
// commit, and id (write) order among rows it first sees together.
func TestKeyOrderIsCommitOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	r := f.relay(t, f.pub, nil)
	write := func(payload string) (*message.Message, func()) {
		tx, err := f.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := keyed("k", payload)
		if err := f.w.WriteTx(ctx, tx, f.topic, m); err != nil {
			t.Fatal(err)
		}
		return m, func() {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	drain := func() {
		for f.pending(t) > 0 {
			if _, err := r.RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A writes first (lower id), B second; B commits and is published
	// before A commits.
	a, commitA := write("a")
	b, commitB := write("b")
	commitB()
	drain()
	commitA()
	drain()
	// C writes first, D second; both commit, D first, before the relay looks.
	c, commitC := write("c")
	d, commitD := write("d")
	commitD()
	commitC()
	drain()
	want := []string{b.UUID, a.UUID, c.UUID, d.UUID}
	if got := onKafka(t, f.topic, 1, "k"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("key k on Kafka: %v, want %v", got, want)
	}
}

// droppingPublisher calls drop on its first call, and fails every call.
type droppingPublisher struct {
	message.Publisher
	once sync.Once
	drop func()
}

func (p *droppingPublisher) Publish(string, ...*message.Message) error {
	p.once.Do(p.drop)
	return errors.New("test: broker unreachable")
}

// Postgres drops the relay's connection mid-batch, as the publisher fails:
// RunOnce reports the batch's own error (recording the failure) as well as
// the lane unlock's.
func TestConnectionLostMidBatchKeepsBothErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ctx := context.Background()
	f.commitOne(t, f.topic, keyed("k", "1"), keyed("k2", "2"))
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgtest.Config(url)
	if err != nil {
		t.Fatal(err)
	}
	app := "relay-lost-" + f.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub := &droppingPublisher{Publisher: f.pub, drop: func() {
		// Terminate the session that holds the lanes.
		var n int
		if err := f.db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory')`, app).Scan(&n); err != nil || n != 1 {
			t.Errorf("terminated %d sessions (%v), want the relay's one", n, err)
		}
	}}
	r, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.RunOnce(ctx)
	if err == nil {
		t.Fatal("RunOnce on a dropped connection returned no error")
	}
	msg := err.Error()
	if !strings.Contains(msg, "lane unlock") || !strings.Contains(msg, "record failure") {
		t.Fatalf("error %q: want the batch's error (record failure) and the unlock's", msg)
	}
	var target interface{ Unwrap() []error }
	if !errors.As(err, &target) {
		t.Fatalf("error %q does not join its causes", msg)
	}
}

// chunkyPublisher publishes a call in chunks of three, as kafka-go splits a
// call into requests, and drops a chunk now and then but goes on with the
// next one, as kafka-go does after a failed request; the call then fails.
type chunkyPublisher struct {
	message.Publisher
	mu      sync.Mutex
	rng     *rand.Rand
	dropped atomic.Int64
}

func (p *chunkyPublisher) Publish(topic string, msgs ...*message.Message) error {
	var failed bool
	for i := 0; i < len(msgs); i += 3 {
		p.mu.Lock()
		drop := p.rng.IntN(6) == 0
		p.mu.Unlock()
		if drop {
			failed = true
			p.dropped.Add(1)
			continue
		}
		if err := p.Publisher.Publish(topic, msgs[i:min(i+3, len(msgs))]...); err != nil {
			return err
		}
	}
	if failed {
		return errors.New("test: a request failed")
	}
	return nil
}

// A publisher that loses some requests of a call and delivers the later
// ones: every message reaches Kafka, and each key's first copies are in
// order (copies of retried messages may follow).
func TestKeyOrderWhenThePublisherLosesRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	f.write(t, 60, 20, 12)
	pub := &chunkyPublisher{Publisher: f.pub, rng: rand.New(rand.NewPCG(1, 2))}
	r := f.relay(t, pub, &outbox.RelayConfig{BatchSize: 50, RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
		MaxAttempts: 1000, PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.WaitFor(t, 2*time.Minute, "the outbox to drain", func() bool { return f.pending(t) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if pub.dropped.Load() == 0 {
		t.Fatal("the publisher dropped nothing: the test tested nothing")
	}
	f.check(t, true)
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
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

// counter counts calls per message UUID.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(u string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[u]++
	return c.n[u]
}

func (c *counter) get(u string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[u]
}

// deliveries counts how often the router hands each message to the chain.
func deliveries(c *counter) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c.inc(msg.UUID)
			return h(msg)
		}
	}
}

// Under a router the middleware hands a failed attempt back to the
// Subscriber itself (nacked, no error for the chain): attempt 1 fails
// transiently, and the second delivery applies the command, once. The
// Retry of the documented chain does not run it again in process.
func TestDocumentedChainRedelivers(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	exp, recs := commands(20)
	w.produce(recs...)
	var calls, delivered counter
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, outer: deliveries(&delivered), handler: w.handler(func(msg *message.Message) error {
		if calls.inc(msg.UUID) == 1 {
			return errors.New("deadline of a downstream call")
		}
		return nil
	})})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	for u := range exp {
		if calls.get(u) != 2 || delivered.get(u) != 2 {
			t.Errorf("%s: handler ran %d times in %d deliveries, want 2 in 2 (nacked, delivered again)", u, calls.get(u), delivered.get(u))
		}
	}
}

// Without ResetContextOnRetry, Retry hands the next attempt the cancelled
// context of Timeout's: the middleware says so (misconfigured) rather than
// failing with "context canceled", and nothing is lost. (Under a router
// the middleware returns no error that a Retry would retry; this is a
// consumer loop of its own that acks and nacks by the chain's error.)
func TestRetryWithoutContextResetIsNamed(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(5)
	w.produce(recs...)
	var calls counter
	hooks := &countingHooks{}
	mw, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "ledger", Hooks: hooks, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(w.pub, w.dlq, dedupe.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	noReset := middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, ShouldRetry: consumer.ShouldRetry}
	h := poison(noReset.Middleware(middleware.Timeout(time.Second)(mw.Middleware(middleware.Recoverer(
		w.handler(func(msg *message.Message) error {
			if calls.inc(msg.UUID) == 1 {
				return errors.New("transient")
			}
			return nil
		}))))))
	group := kafkatest.Name("g")
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: w.brokers, ConsumerGroup: group,
		NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, w.topic)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range msgs {
			if _, err := h(msg); err != nil {
				msg.Nack()
			} else {
				msg.Ack()
			}
		}
	}()
	t.Cleanup(func() { cancel(); _ = sub.Close(); <-done })
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if hooks.get(consumer.OutcomeMisconfigured) == 0 {
		t.Errorf("no attempt reported the stale context: %v", hooks.n)
	}
}

// Retry or PoisonQueue inside the dedupe middleware would run the handler
// again on the same transaction, or commit a failed handler's writes: the
// transaction serves one call and a swallowed error rolls back.
func TestMisorderedChainCannotApplyTwice(t *testing.T) {
	t.Parallel()
	for name, order := range map[string]func(c chain) []message.HandlerMiddleware{
		"RetryInside": func(c chain) []message.HandlerMiddleware {
			return []message.HandlerMiddleware{c.poison, c.dedupe, c.retry, c.recoverer}
		},
		"PoisonQueueInside": func(c chain) []message.HandlerMiddleware {
			return []message.HandlerMiddleware{c.retry, c.dedupe, c.poison, c.recoverer}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, 1)
			exp, recs := commands(5)
			w.produce(recs...)
			var calls counter
			hooks := &countingHooks{}
			group := kafkatest.Name("g")
			w.startRouter(routerOpts{group: group, hooks: hooks, chain: order,
				handler: w.handler(func(msg *message.Message) error {
					if calls.inc(msg.UUID) != 1 {
						return nil
					}
					// The first attempt writes more, then fails: none of it may commit.
					tx, _ := consumer.Tx(msg)
					if _, err := tx.Exec(msg.Context(), "INSERT INTO "+w.db.Table("balances")+" VALUES ('bogus-'||$1, 1000)", msg.UUID); err != nil {
						return err
					}
					if name == "PoisonQueueInside" {
						return fmt.Errorf("bad amount: %w", dedupe.ErrInvalidPayload) // for the inner PoisonQueue
					}
					return errors.New("transient")
				})})
			w.waitCaughtUp(group, 2*time.Minute)
			w.assertExactlyOnce(exp) // balances: the failed attempts' writes never commit
			if hooks.get(consumer.OutcomeMisconfigured) == 0 {
				t.Errorf("the misordered chain was not reported: %v", hooks.n)
			}
		})
	}
}

// Two handlers consume one topic through a router-level middleware with a
// fixed Scope: neither may skip a message the other applied. The second
// handler is refused (misconfigured) and acks nothing it did not apply;
// with scopes per handler (Scope left empty) each applies all 10.
func TestTwoHandlersOneTopic(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"shared", ""} {
		t.Run("Scope="+scope, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, 2)
			_, recs := commands(10)
			w.produce(recs...)
			byHandler := w.db.Table("by_handler")
			if _, err := w.db.Pool.Exec(context.Background(), "CREATE TABLE "+byHandler+" (handler text, uuid text, PRIMARY KEY (handler, uuid))"); err != nil {
				t.Fatal(err)
			}
			hooks := &countingHooks{}
			mw, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: scope, Hooks: hooks, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NewSlogLogger(quietLogger()))
			if err != nil {
				t.Fatal(err)
			}
			retry := middleware.Retry{MaxRetries: 1, InitialInterval: 5 * time.Millisecond, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
			r.AddMiddleware(retry.Middleware, middleware.Timeout(5*time.Second), mw.Middleware, middleware.Recoverer)
			groups := map[string]string{}
			for _, name := range []string{"a", "b"} {
				group := kafkatest.Name("g")
				groups[name] = group
				sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: w.brokers, ConsumerGroup: group,
					NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond, Logger: quietLogger()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Close() })
				h := consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
					_, err := tx.Exec(ctx, "INSERT INTO "+byHandler+" VALUES ($1, $2)", name, msg.UUID)
					return nil, err
				})
				r.AddConsumerHandler(name, w.topic, sub, func(msg *message.Message) error { _, err := h(msg); return err })
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			applied := func(h string) int { return w.count("SELECT count(*) FROM "+byHandler+" WHERE handler = $1", h) }
			acked := func(h string) int {
				n := 0
				for _, o := range kafkatest.CommittedOffsetsOn(t, w.brokers, groups[h], w.topic, w.partitions) {
					n += int(max(o, 0))
				}
				return n
			}
			if scope == "" {
				testenv.WaitFor(t, 2*time.Minute, "both handlers to apply all 10", func() bool {
					return applied("a") == 10 && applied("b") == 10 && acked("a") == 10 && acked("b") == 10
				})
				return
			}
			testenv.WaitFor(t, 2*time.Minute, "one handler to apply all 10 and the other to be refused", func() bool {
				return (applied("a") == 10 || applied("b") == 10) && hooks.get(consumer.OutcomeMisconfigured) >= 3
			})
			for _, h := range []string{"a", "b"} {
				if a, k := applied(h), acked(h); k > a {
					t.Errorf("handler %s acked %d messages but applied %d: it skipped the others", h, k, a)
				}
			}
		})
	}
}

// levelCounter is a slog handler that counts records by level.
type levelCounter struct {
	mu sync.Mutex
	n  map[slog.Level]int
}

func (l *levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[slog.Level]int{}
	}
	l.n[r.Level]++
	return nil
}
func (l *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelCounter) WithGroup(string) slog.Handler      { return l }
func (l *levelCounter) atLeast(level slog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for lv, c := range l.n {
		if lv >= level {
			n += c
		}
	}
	return n
}

// A record whose handler panics every time, and one whose handler always
// fails, reach the dead-letter topic after a bounded number of attempts,
// with the reason; the records after them are applied.
func TestPoisonRecordsAreDeadLettered(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(20)
	panics, fails := watermill.NewUUID(), watermill.NewUUID()
	all := append([]kafka.Message{record(panics, "acc-p", 1), record(fails, "acc-f", 1)}, recs...)
	w.produce(all...)
	var calls counter
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks, cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 5},
		handler: w.handler(func(msg *message.Message) error {
			calls.inc(msg.UUID)
			switch msg.UUID {
			case panics:
				panic("index out of range in the amount parser")
			case fails:
				return errors.New("account acc-f is frozen")
			}
			return nil
		})})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	dead := w.readTopic(w.dlq)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[header(d, kafkapubsub.UUIDHeader)] = header(d, middleware.ReasonForPoisonedKey)
	}
	if len(dead) != 2 || !strings.Contains(reasons[panics], "panic") || !strings.Contains(reasons[fails], "frozen") {
		t.Fatalf("%d dead letters, reasons %q", len(dead), reasons)
	}
	if calls.get(panics) != 5 || calls.get(fails) != 5 {
		t.Errorf("attempts: %d and %d, want MaxAttempts = 5", calls.get(panics), calls.get(fails))
	}
	if hooks.get(consumer.OutcomePoisoned) != 2 {
		t.Errorf("hooks: %v", hooks.n)
	}
}

// A Postgres outage mid-stream lasts far longer than MaxAttempts attempts:
// nothing is dead-lettered, nothing lost, each message applied once, and the
// outage shows in the logs at WARN or above.
func TestPostgresOutageDeadLettersNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	pool, px := proxiedPool(t)
	w.useStore(pool)
	exp, recs := commands(300)
	logs := &levelCounter{}
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	slow := func(*message.Message) error { time.Sleep(5 * time.Millisecond); return nil }
	w.startRouter(routerOpts{group: group, hooks: hooks, logger: slog.New(logs),
		cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 3}, handler: w.handler(slow)})
	w.produce(recs...)
	testenv.WaitFor(t, 2*time.Minute, "the first applications", func() bool { return w.applied() >= 20 })
	px.setDown(true)
	testenv.WaitFor(t, 2*time.Minute, "many failed attempts during the outage", func() bool {
		return hooks.get(consumer.OutcomeUnavailable) >= 20
	})
	px.setDown(false)
	w.waitCaughtUp(group, 3*time.Minute)
	w.assertExactlyOnce(exp)
	if dead := w.readTopic(w.dlq); len(dead) != 0 {
		t.Fatalf("%d messages dead-lettered during an outage", len(dead))
	}
	if hooks.get(consumer.OutcomePoisoned) != 0 || logs.atLeast(slog.LevelWarn) == 0 {
		t.Fatalf("poisoned %d, WARN+ log records %d: want 0 and some", hooks.get(consumer.OutcomePoisoned), logs.atLeast(slog.LevelWarn))
	}
}

// A table that is not there (unmigrated schema, or the handler's own
// unqualified table) is a configuration error: Check reports it at start-up
// with the fix, and at run time it is retried, never dead-lettered, even
// past MaxAttempts.
func TestMissingTablesAreConfigurationErrors(t *testing.T) {
	t.Parallel()
	t.Run("StoreTable", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, 1)
		empty := pgtest.NewEmpty(t)
		store, err := pgstore.New(w.db.Pool, &pgstore.Config{Schema: empty.Schema})
		if err != nil {
			t.Fatal(err)
		}
		w.store = store
		mw, _ := consumer.NewMiddleware(store, nil)
		if err := mw.Check(context.Background()); !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "migrations.Migrate") {
			t.Fatalf("Check = %v, want a configuration error naming migrations.Migrate", err)
		}
		_, recs := commands(3)
		w.produce(recs...)
		hooks := &countingHooks{}
		w.startRouter(routerOpts{group: kafkatest.Name("g"), hooks: hooks, cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 2}})
		testenv.WaitFor(t, 2*time.Minute, "repeated configuration errors", func() bool { return hooks.get(consumer.OutcomeMisconfigured) >= 6 })
		if dead := w.readTopic(w.dlq); len(dead) != 0 || w.applied() != 0 || hooks.get(consumer.OutcomePoisoned) != 0 {
			t.Fatalf("dead letters %d, applied %d, hooks %v", len(dead), w.applied(), hooks.n)
		}
	})
	t.Run("HandlerTable", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, 1)
		_, recs := commands(3)
		w.produce(recs...)
		hooks := &countingHooks{}
		unqualified := consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			_, err := tx.Exec(ctx, "UPDATE balances SET balance = balance + 1") // search_path does not find it
			return nil, err
		})
		w.startRouter(routerOpts{group: kafkatest.Name("g"), hooks: hooks, handler: unqualified, cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 2}})
		testenv.WaitFor(t, 2*time.Minute, "repeated configuration errors", func() bool { return hooks.get(consumer.OutcomeMisconfigured) >= 6 })
		if dead := w.readTopic(w.dlq); len(dead) != 0 || hooks.get(consumer.OutcomePoisoned) != 0 {
			t.Fatalf("dead letters %d, hooks %v", len(dead), hooks.n)
		}
	})
}

// A payload that cannot be fingerprinted is dead-lettered under its own
// outcome, not counted as a failure.
func TestInvalidPayloadOutcome(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(2)
	bad := record(watermill.NewUUID(), "acc-x", 1)
	bad.Value = []byte(`{"account":"acc-x","amount":1e1000000001}`)
	w.produce(append([]kafka.Message{bad}, recs...)...)
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks, cfg: &consumer.Config{Scope: "ledger", FingerprintFunc: dedupe.JSONFingerprint}})
	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(exp)
	if dead := w.readTopic(w.dlq); len(dead) != 1 || !strings.Contains(header(dead[0], middleware.ReasonForPoisonedKey), "invalid payload") {
		t.Fatalf("dead letters: %d", len(dead))
	}
	if hooks.get(consumer.OutcomeInvalidPayload) != 1 || hooks.get(consumer.OutcomeFailed) != 0 {
		t.Fatalf("hooks %v, want one invalid_payload and no failed", hooks.n)
	}
}

// Lease mode: middleware.Timeout cancels the message's context after the
// external effect succeeded; the key is completed all the same and the
// redeliveries are duplicates, so the effect runs once.
func TestLeaseModeTimeoutAfterEffect(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(5)
	w.produce(append(recs, recs...)...)
	var effects counter
	h := func(msg *message.Message) ([]*message.Message, error) {
		effects.inc(msg.UUID)  // the payment went through
		<-msg.Context().Done() // and the answer came after the Timeout
		return nil, nil
	}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, handler: h, cfg: &consumer.Config{Scope: "payments", Lease: 30 * time.Second}})
	w.waitCaughtUp(group, 2*time.Minute)
	for u := range exp {
		if effects.get(u) != 1 {
			t.Errorf("%s: external effect ran %d times, want 1", u, effects.get(u))
		}
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Keys() + " WHERE status = 'COMPLETED'"); n != len(exp) {
		t.Fatalf("%d completed keys, want %d", n, len(exp))
	}
}

// proxiedPool returns a pool whose connections go through a proxy that can
// cut them (see newProxy).
func proxiedPool(t *testing.T) (*pgxpool.Pool, *proxy) {
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(px.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil // "localhost" gives fallbacks that name the real server, past the proxy
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, px
}

// CheckTopics finds a missing dead-letter topic at start-up.
func TestCheckTopics(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	there := kafkatest.Name("dlq")
	kafkatest.CreateTopicOn(t, brokers, there, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, there); err != nil {
		t.Fatalf("existing topic: %v", err)
	}
	missing := kafkatest.Name("dlq")
	err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, there, missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "create it") {
		t.Fatalf("missing topic: %v", err)
	}
	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, missing); err == nil {
		t.Fatal("checking the missing topic created it")
	}
}

// Outside a router with no Config.Scope, or wrapped twice, the middleware
// refuses with a configuration error instead of dead-lettering the message
// (an empty scope would make every key invalid) or waiting on itself.
func TestMiddlewareMisuseIsAConfigurationError(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	mw, _ := consumer.NewMiddleware(store, &consumer.Config{Logger: quietLogger()})
	_, err = mw.Middleware(noop)(message.NewMessage(watermill.NewUUID(), []byte("p")))
	if !errors.Is(err, dedupe.ErrMisconfigured) || dedupe.IsPermanent(err) || !strings.Contains(err.Error(), "Config.Scope") {
		t.Fatalf("no scope: %v", err)
	}
	scoped, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "s", Logger: quietLogger()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
	msg.SetContext(ctx)
	_, err = scoped.Middleware(scoped.Middleware(noop))(msg)
	if !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "wraps itself") {
		t.Fatalf("nested: %v", err)
	}
	if _, err := store.Get(ctx, dedupe.Key{Scope: "s", ID: msg.UUID}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("the refused message left a key: %v", err)
	}
}

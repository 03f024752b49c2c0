package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
)

// runOwnRouter runs a router on the world's topic with the chain mws
// (outermost first) and the handler that register adds; it returns a stop
// function.
func (w *world) runOwnRouter(group string, mws []message.HandlerMiddleware,
	register func(r *message.Router, sub message.Subscriber)) (stop func()) {
	t := w.t
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NewSlogLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: w.brokers, ConsumerGroup: group, NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, DrainTimeout: 5 * time.Second, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(mws...)
	register(r, sub)
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
	stop = func() { once.Do(func() { cancel(); <-done; _ = sub.Close() }) }
	t.Cleanup(stop)
	return stop
}

// acked sums the group's committed offsets over the world's topic.
func (w *world) acked(group string) int64 {
	var n int64
	for _, o := range kafkatest.CommittedOffsetsOn(w.t, w.brokers, group, w.topic, w.partitions) {
		n += max(o, 0)
	}
	return n
}

// A TxHandler registered with router.AddConsumerHandler while
// Config.Outputs is set: the router's adapter drops the events before the
// middleware sees them. Nothing may commit without them: no balance, no
// key, no offset, and nothing dead-lettered; registered with AddHandler,
// every command is then applied once with its event in the outbox.
func TestOutputsDroppedBeforeTheOutboxAreRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	wr, err := outbox.NewWriter(&outbox.Config{Schema: w.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	exp, recs := commands(5)
	w.produce(recs...)
	hooks := &countingHooks{}
	newMiddleware := func() *consumer.Middleware {
		mw, err := consumer.NewMiddleware(w.store, &consumer.Config{Scope: "ledger", Outputs: wr.Outputs("events"),
			Hooks: hooks, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	chainFor := func(mw *consumer.Middleware) []message.HandlerMiddleware {
		poison, err := middleware.PoisonQueueWithFilter(w.pub, w.dlq, dedupe.IsPermanent)
		if err != nil {
			t.Fatal(err)
		}
		retry := middleware.Retry{MaxRetries: 2, InitialInterval: 5 * time.Millisecond, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
		return []message.HandlerMiddleware{poison, retry.Middleware, middleware.Timeout(5 * time.Second), mw.Middleware, middleware.Recoverer}
	}
	group := kafkatest.Name("g")
	h := w.handler(nil) // applies the command and returns one event
	stop := w.runOwnRouter(group, chainFor(newMiddleware()), func(r *message.Router, sub message.Subscriber) {
		r.AddConsumerHandler("ledger", w.topic, sub, func(msg *message.Message) error { _, err := h(msg); return err })
	})
	testenv.WaitFor(t, 2*time.Minute, "the refusals (or, without the check, the commands applied)", func() bool {
		return hooks.get(consumer.OutcomeMisconfigured) >= 5 || w.applied() > 0
	})
	stop()
	outboxRows := func() int { return w.count("SELECT count(*) FROM " + w.db.Table("exactly_outbox")) }
	keys := w.count("SELECT count(*) FROM " + w.db.Keys())
	if a, o, k, off := w.applied(), outboxRows(), keys, w.acked(group); a != 0 || o != 0 || k != 0 || off != 0 {
		t.Fatalf("with the outputs dropped: %d commands applied, %d outbox rows, %d keys, %d offsets committed; want all 0", a, o, k, off)
	}
	if dead := w.readTopic(w.dlq); len(dead) != 0 {
		t.Fatalf("%d records dead-lettered for a configuration error", len(dead))
	}

	// The fix: the same group, the handler registered with AddHandler.
	w.runOwnRouter(group, chainFor(newMiddleware()), func(r *message.Router, sub message.Subscriber) {
		r.AddHandler("ledger", w.topic, sub, w.out, w.pub, h)
	})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if n := outboxRows(); n != len(exp) {
		t.Fatalf("%d outbox rows, want one event per command (%d)", n, len(exp))
	}
}

// A Postgres outage far longer than Retry's attempts under Watermill's
// usual middleware.PoisonQueue, which dead-letters every error it sees:
// nothing is dead-lettered or acked unapplied, and once the outage ends
// every command is applied once. With and without a Retry.
func TestOutageUnderPoisonQueueWithoutFilter(t *testing.T) {
	t.Parallel()
	for _, withRetry := range []bool{true, false} {
		t.Run(fmt.Sprint("Retry=", withRetry), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, 2)
			pool, px := proxiedPool(t)
			w.useStore(pool)
			exp, recs := commands(200)
			hooks := &countingHooks{}
			group := kafkatest.Name("g")
			slow := func(*message.Message) error { time.Sleep(5 * time.Millisecond); return nil }
			w.startRouter(routerOpts{group: group, hooks: hooks, handler: w.handler(slow),
				cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 3},
				chain: func(c chain) []message.HandlerMiddleware {
					poison, err := middleware.PoisonQueue(w.pub, w.dlq) // no filter: every error it sees goes to the DLQ
					if err != nil {
						t.Fatal(err)
					}
					if withRetry {
						return []message.HandlerMiddleware{poison, c.retry, c.timeout, c.dedupe, c.recoverer}
					}
					return []message.HandlerMiddleware{poison, c.timeout, c.dedupe, c.recoverer}
				}})
			w.produce(recs...)
			testenv.WaitFor(t, 2*time.Minute, "the first applications", func() bool { return w.applied() >= 20 })
			px.setDown(true)
			// Each message that fails gets 3 attempts from the Retry: 30
			// failed attempts are several messages past their last retry.
			testenv.WaitFor(t, 2*time.Minute, "many failed attempts during the outage", func() bool {
				return hooks.get(consumer.OutcomeUnavailable) >= 30
			})
			px.setDown(false)
			w.waitCaughtUp(group, 3*time.Minute)
			if dead := w.readTopic(w.dlq); len(dead) != 0 {
				t.Errorf("%d commands dead-lettered with the outage's error", len(dead))
			}
			w.assertExactlyOnce(exp)
		})
	}
}

// A handler whose downstream call fails on more attempts than Retry makes,
// under Watermill's usual middleware.PoisonQueue: each command is delivered
// again until it succeeds, below Config.MaxAttempts, and applied once;
// none is dead-lettered.
func TestHandlerFailuresPastRetryUnderPoisonQueueWithoutFilter(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	exp, recs := commands(20)
	w.produce(recs...)
	var calls counter
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, cfg: &consumer.Config{Scope: "ledger", MaxAttempts: 10},
		chain: func(c chain) []message.HandlerMiddleware {
			poison, err := middleware.PoisonQueue(w.pub, w.dlq)
			if err != nil {
				t.Fatal(err)
			}
			return []message.HandlerMiddleware{poison, c.retry, c.timeout, c.dedupe, c.recoverer}
		},
		handler: w.handler(func(msg *message.Message) error {
			if calls.inc(msg.UUID) <= 4 { // Retry makes 3 attempts
				return errors.New("downstream timed out")
			}
			return nil
		})})
	w.waitCaughtUp(group, 2*time.Minute)
	if dead := w.readTopic(w.dlq); len(dead) != 0 {
		t.Errorf("%d commands dead-lettered with a failure that was not permanent", len(dead))
	}
	w.assertExactlyOnce(exp)
	for u := range exp {
		if n := calls.get(u); n != 5 {
			t.Errorf("%s: handler ran %d times, want 5 (4 failures, then applied)", u, n)
		}
	}
}

// A Retry without ShouldRetry retries a permanent error that no retry can
// fix: the handler runs once, not once per retry, and the dead letter's
// reason names ShouldRetry as the fix, besides the handler's own reason.
// The other commands are applied once.
func TestRetryWithoutShouldRetryNamesIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(10)
	bad := watermill.NewUUID()
	w.produce(append([]kafka.Message{record(bad, "acc-x", -5)}, recs...)...)
	var calls counter
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group,
		chain: func(c chain) []message.HandlerMiddleware {
			retry := middleware.Retry{MaxRetries: 3, InitialInterval: 5 * time.Millisecond, ResetContextOnRetry: true} // no ShouldRetry
			return []message.HandlerMiddleware{c.poison, retry.Middleware, c.timeout, c.dedupe, c.recoverer}
		},
		handler: w.handler(func(msg *message.Message) error {
			calls.inc(msg.UUID)
			if msg.UUID == bad {
				return dedupe.Permanent(errors.New("amount -5: want > 0"))
			}
			return nil
		})})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	dead := w.readTopic(w.dlq)
	if len(dead) != 1 || header(dead[0], kafkapubsub.UUIDHeader) != bad {
		t.Fatalf("%d dead letters, want the one rejected command", len(dead))
	}
	reason := header(dead[0], middleware.ReasonForPoisonedKey)
	if !strings.Contains(reason, "ShouldRetry") || !strings.Contains(reason, "amount -5") {
		t.Errorf("dead letter's reason %q: want the handler's and the fix, ShouldRetry", reason)
	}
	if n := calls.get(bad); n != 1 {
		t.Errorf("the rejecting handler ran %d times, want 1: a permanent error is not retried", n)
	}
}

// Duplicates are logged at DEBUG, so that a replay of a whole topic does
// not print a line per record at INFO; Config.LogDuplicates logs them at
// INFO.
func TestDuplicatesLogAtDebug(t *testing.T) {
	t.Parallel()
	noop := consumer.TxHandler(func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) { return nil, nil })
	for _, info := range []bool{false, true} {
		logs := &levelCounter{}
		h, err := consumertest.NewHandler(consumertest.NewMemStore(nil), noop,
			&consumer.Config{Logger: slog.New(logs), LogDuplicates: info})
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		for range 3 {
			h.Run(context.Background(), t, msg.Copy())
		}
		want := 0
		if info {
			want = 2
		}
		if n := logs.atLeast(slog.LevelInfo); n != want {
			t.Errorf("LogDuplicates %v: %d records at INFO or above for 1 application and 2 duplicates, want %d", info, n, want)
		}
	}
}

// A handler's error marked with dedupe.Permanent is permanent, reported as
// rejected, and leaves no key: the message is for the dead-letter topic.
func TestPermanentHandlerErrorIsRejected(t *testing.T) {
	t.Parallel()
	reject := consumer.TxHandler(func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) {
		return nil, dedupe.Permanent(errors.New("amount -5: want > 0"))
	})
	h, err := consumertest.NewHandler(consumertest.NewMemStore(nil), reject, &consumer.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	r := h.Run(context.Background(), t, message.NewMessage(watermill.NewUUID(), []byte("p")))
	if r.Outcome != consumer.OutcomeRejected || !dedupe.IsPermanent(r.Err) || r.Stored {
		t.Fatalf("outcome %s, err %v, key stored %v: want rejected, a permanent error, no key", r.Outcome, r.Err, r.Stored)
	}
}

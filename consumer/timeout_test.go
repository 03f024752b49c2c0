package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// A batch whose connection goes silent in the middle of its transaction
// (the peer gone without a word: every byte dropped, nothing closed) is
// ended by BatchConfig.Timeout and nacked whole as an outage; once new
// connections work again every message is applied exactly once and none is
// dead-lettered. Without the bound the batch waits on the dead connection
// forever and its partition's worker with it.
func TestBatchTimeoutEndsAStuckBatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	hole := pgtest.NewBlackHole(t)
	pool := hole.Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 8
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		// The server ends the session the dead connection left idle in
		// its transaction (as idle_in_transaction_session_timeout or
		// keepalives do in production), letting go of its claimed keys.
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "3000"
	})
	w.useStore(pool)
	exp, recs := commands(60)

	inside := make(chan struct{})    // the first batch has written and waits
	swallowed := make(chan struct{}) // its connection is dead now
	var first atomic.Bool
	h := w.batchHandler(nil, func([]*message.Message) error {
		if first.CompareAndSwap(false, true) {
			close(inside)
			<-swallowed
		}
		return nil
	})
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startBatch(group, h, consumer.BatchConfig{Config: consumer.Config{Hooks: hooks}, Timeout: 2 * time.Second})
	w.produce(recs...)
	select {
	case <-inside:
	case <-time.After(time.Minute):
		t.Fatal("no batch reached the handler")
	}
	hole.Swallow()
	close(swallowed)
	time.Sleep(3 * time.Second) // new connections are held silent too, for a while
	hole.Release()

	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(exp)
	if dl := w.readTopic(w.dlq); len(dl) > 0 {
		t.Errorf("%d messages dead-lettered, want none (the first: %q)", len(dl), header(dl[0], "reason_poisoned"))
	}
	if hole.Swallowed() == 0 {
		t.Fatal("no connection was swallowed: the test did not exercise a dead connection")
	}
	if n := hooks.get(consumer.OutcomeUnavailable); n == 0 {
		t.Errorf("no message had outcome unavailable: the stuck batch was not nacked as an outage")
	}
	for _, o := range []consumer.Outcome{consumer.OutcomePoisoned, consumer.OutcomeFailed, consumer.OutcomeRejected} {
		if n := hooks.get(o); n > 0 {
			t.Errorf("%d messages with outcome %s: a timed-out batch is no message's fault", n, o)
		}
	}
}

// NewBatchConsumer refuses negative sizes and durations, naming the field.
func TestNewBatchConsumerRefusesNegatives(t *testing.T) {
	t.Parallel()
	store := refusingStore(t)
	h := (&world{}).batchHandler(nil, nil)
	for field, cfg := range map[string]consumer.BatchConfig{
		"MaxSize": {MaxSize: -1},
		"MaxWait": {MaxWait: -time.Millisecond},
		"Workers": {Workers: -1},
		"Timeout": {Timeout: -time.Second},
	} {
		cfg.Scope = "s"
		if _, err := consumer.NewBatchConsumer(store, h, &cfg); err == nil || !strings.Contains(err.Error(), "BatchConfig."+field) {
			t.Errorf("%s negative: err %v, want one naming BatchConfig.%s", field, err, field)
		}
	}
	if _, err := consumer.NewBatchConsumer(store, h, &consumer.BatchConfig{Config: consumer.Config{Scope: "s"}, Timeout: time.Second}); err != nil {
		t.Errorf("a positive Timeout: %v", err)
	}
}

// A batch attempt cut by BatchConfig.Timeout while the database answers but
// its handler waits for a lock that another (silent) session holds is an
// outage: the batch is nacked whole, not split, and no message is
// dead-lettered or counted towards MaxAttempts, though a ping succeeds.
func TestBatchTimeoutNacksTheBatchWhole(t *testing.T) {
	t.Parallel()
	batchCutWaitingForLock(t, time.Second, time.Second)
}

// The same when the handler first runs its own code past the time the
// session is first read (shortly before the deadline), and only then waits
// for the lock until the deadline: what counts is what the session did
// just before the deadline, not at the first read.
func TestBatchTimeoutJudgedAtItsDeadline(t *testing.T) {
	t.Parallel()
	batchCutWaitingForLock(t, time.Second, 150*time.Millisecond)
}

// batchCutWaitingForLock runs a batch whose handler runs its own code until
// waiting before its deadline, then waits for a lock held elsewhere.
func batchCutWaitingForLock(t *testing.T, timeout, waiting time.Duration) {
	w := newWorld(t, 1)
	ctx := context.Background()
	holder, err := w.store.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	lock := time.Now().UnixNano()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", lock) }()
	f := newFakeMsgs(10, func(i int) string { return fmt.Sprint("acc-", i%3) })
	var calls atomic.Int64
	stuck := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		calls.Add(1)
		if dl, ok := ctx.Deadline(); ok {
			time.Sleep(time.Until(dl.Add(-waiting))) // its own code, the session idle in its transaction
		}
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lock)
		return nil, err
	}
	pub := &recordingPublisher{}
	hooks := &countingHooks{}
	c, err := consumer.NewBatchConsumer(w.store, stuck, &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", MaxAttempts: 1, Hooks: hooks, Logger: quietLogger()},
		MaxSize:         10,
		MaxWait:         time.Second,
		Timeout:         timeout,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, nacked := f.run(t, c)
	if len(acked) != 0 || len(nacked) != 10 {
		t.Fatalf("acked %v, nacked %v; want all nacked", acked, nacked)
	}
	if dead := pub.get("dlq"); len(dead) > 0 {
		t.Fatalf("%d messages dead-lettered, want none", len(dead))
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once: the batch was split", n)
	}
	if n := hooks.get(consumer.OutcomeUnavailable); n != 10 {
		t.Errorf("%d messages with outcome unavailable, want 10", n)
	}
	if n := w.applied(); n != 0 {
		t.Errorf("%d messages applied, want none", n)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// (a) Every message produced three times with the same UUID is applied once.
func TestProducedThreeTimesAppliedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	exp, recs := commands(300)
	var all []kafka.Message
	for i := 0; i < 3; i++ {
		all = append(all, recs...)
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	w.produce(all...)
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if n := w.count("SELECT count(*) FROM " + w.db.Keys()); n != len(exp) {
		t.Errorf("%d keys stored, want %d", n, len(exp))
	}
	// Each key records where its message came from.
	if n := w.count("SELECT count(*) FROM "+w.db.Keys()+" WHERE source_topic = $1 AND source_partition BETWEEN 0 AND 3 AND source_offset >= 0", w.topic); n != len(exp) {
		t.Errorf("%d keys with their source, want %d", n, len(exp))
	}
	if a, d := hooks.get(consumer.OutcomeApplied), hooks.get(consumer.OutcomeDuplicate); a != len(exp) || d != 2*len(exp) {
		t.Errorf("hooks: %d applied, %d duplicates; want %d and %d", a, d, len(exp), 2*len(exp))
	}
}

// (b) The handler fails at random a fifth of the time, after its writes:
// every message is applied exactly once and none is lost.
func TestRandomHandlerFailuresAppliedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	exp, recs := commands(300)
	w.produce(recs...)
	var failures atomic.Int64
	fail := func(*message.Message) error {
		if rand.IntN(5) == 0 {
			failures.Add(1)
			return errors.New("random failure")
		}
		return nil
	}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, handler: w.handler(fail)})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if failures.Load() < 20 {
		t.Errorf("only %d failures injected", failures.Load())
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Keys()); n != len(exp) {
		t.Errorf("%d keys stored, want %d", n, len(exp))
	}
}

// (c) Two consumers share a group; a third joins and one leaves while the
// stream is consumed: every message is still applied exactly once.
func TestRebalanceMidStream(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 6)
	exp, recs := commands(600)
	group := kafkatest.Name("g")
	slow := func(*message.Message) error { time.Sleep(3 * time.Millisecond); return nil }
	stop1 := w.startRouter(routerOpts{group: group, handler: w.handler(slow)})
	w.startRouter(routerOpts{group: group, handler: w.handler(slow)})
	w.produce(recs[:300]...)
	testenv.WaitFor(t, time.Minute, "a third of the stream", func() bool { return w.applied() >= 200 })
	w.startRouter(routerOpts{group: group, handler: w.handler(slow)})
	w.produce(recs[300:]...)
	testenv.WaitFor(t, time.Minute, "half of the stream", func() bool { return w.applied() >= 350 })
	stop1()
	w.waitCaughtUp(group, 3*time.Minute)
	w.assertExactlyOnce(exp)
}

// (d) The same UUID with a different payload is not applied: it lands on
// the dead-letter topic with the reason.
func TestKeyReusedGoesToDeadLetter(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	u := watermill.NewUUID()
	w.produce(record(u, "acc-1", 10), record(u, "acc-1", 99999))
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks})
	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(map[string]command{u: {Account: "acc-1", Amount: 10}})
	dead := w.readTopic(w.dlq)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	reason := header(dead[0], middleware.ReasonForPoisonedKey)
	if header(dead[0], kafkapubsub.UUIDHeader) != u || !strings.Contains(reason, "reused with a different payload") || !strings.Contains(string(dead[0].Value), "99999") {
		t.Fatalf("dead letter uuid=%s reason=%q payload=%s", header(dead[0], kafkapubsub.UUIDHeader), reason, dead[0].Value)
	}
	if hooks.get(consumer.OutcomeKeyReused) != 1 {
		t.Errorf("hooks: %d key reused", hooks.get(consumer.OutcomeKeyReused))
	}
}

// (e) Messages without a UUID follow the configured policy.
func TestMissingKeyPolicies(t *testing.T) {
	t.Parallel()
	t.Run("Reject", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, 1)
		w.produce(record("", "acc-1", 5))
		group := kafkatest.Name("g")
		w.startRouter(routerOpts{group: group})
		w.waitCaughtUp(group, time.Minute)
		w.assertExactlyOnce(nil)
		dead := w.readTopic(w.dlq)
		if len(dead) != 1 || !strings.Contains(header(dead[0], middleware.ReasonForPoisonedKey), "invalid key") {
			t.Fatalf("dead letters %d: %+v", len(dead), dead)
		}
	})
	t.Run("Skip", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, 1)
		w.produce(record("", "acc-1", 5))
		group := kafkatest.Name("g")
		hooks := &countingHooks{}
		w.startRouter(routerOpts{group: group, hooks: hooks, cfg: &consumer.Config{Scope: "ledger", MissingKey: consumer.Skip}})
		w.waitCaughtUp(group, time.Minute)
		if n := w.count("SELECT coalesce(sum(balance), 0)::int FROM " + w.db.Table("balances")); n != 5 {
			t.Fatalf("balance %d, want 5 (applied without protection)", n)
		}
		if hooks.get(consumer.OutcomeSkipped) != 1 || w.count("SELECT count(*) FROM "+w.db.Keys()) != 0 {
			t.Fatal("a skipped message must be counted and store no key")
		}
	})
	t.Run("Derive", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, 2)
		w.produce(record("", "acc-1", 5), record("", "acc-2", 7))
		// The same records consumed by a second group with the same scope
		// are redeliveries of the same offsets: derived keys catch them.
		cfg := func() *consumer.Config { return &consumer.Config{Scope: "ledger", MissingKey: consumer.Derive} }
		g1, g2 := kafkatest.Name("g"), kafkatest.Name("g")
		stop := w.startRouter(routerOpts{group: g1, cfg: cfg()})
		w.waitCaughtUp(g1, time.Minute)
		stop()
		w.startRouter(routerOpts{group: g2, cfg: cfg()})
		w.waitCaughtUp(g2, time.Minute)
		if n := w.count("SELECT coalesce(sum(balance), 0)::int FROM " + w.db.Table("balances")); n != 12 {
			t.Fatalf("balance %d, want 12 (each record once)", n)
		}
		if n := w.count("SELECT count(*) FROM " + w.db.Keys() + " WHERE key LIKE '" + w.topic + "/%'"); n != 2 {
			t.Fatalf("%d derived keys, want 2", n)
		}
	})
}

// (f) A consumer that stops after its transaction committed but before the
// ack: the redelivery is a duplicate and its stored outputs are published,
// with the UUIDs of the first run.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	exp, recs := commands(1)
	var u string
	for k := range exp {
		u = k
	}
	w.produce(recs...)
	group := kafkatest.Name("g")
	committed := make(chan []*message.Message, 1)
	var dead atomic.Bool
	// Outermost: after the commit the process hangs, is shut down, and the
	// message is never acked (the subscriber gives it up after DrainTimeout).
	// A dead process handles nothing more, not even a redelivery that
	// arrives while it shuts down.
	crash := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if dead.Load() {
				<-msg.Context().Done()
				return nil, errors.New("process is dead")
			}
			outs, err := h(msg)
			// A transient failure (a busy machine's timeout) is nacked by
			// the middleware, which then returns no error: not a commit.
			if err == nil && !nackedAlready(msg) && dead.CompareAndSwap(false, true) {
				committed <- outs
				<-msg.Context().Done()
				return nil, errors.New("process died before the ack")
			}
			return outs, err
		}
	}
	stop := w.startRouter(routerOpts{group: group, outer: crash})
	var first []*message.Message
	select {
	case first = <-committed:
	case <-time.After(time.Minute):
		t.Fatal("the first delivery never committed")
	}
	if len(first) != 1 {
		t.Fatalf("first run produced %d outputs", len(first))
	}
	if w.applied() != 1 {
		t.Fatal("the transaction did not commit before the crash")
	}
	stop()
	// Nothing was published by the crashed consumer.
	if got := w.readTopic(w.out); len(got) != 0 {
		t.Fatalf("crashed consumer published %d outputs", len(got))
	}
	hooks := &countingHooks{}
	w.startRouter(routerOpts{group: group, hooks: hooks})
	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(exp)
	outs := w.readTopic(w.out)
	if len(outs) != 1 || header(outs[0], kafkapubsub.UUIDHeader) != first[0].UUID || string(outs[0].Value) != `{"applied":"`+u+`"}` {
		t.Fatalf("outputs %d, want the stored one with UUID %s: %+v", len(outs), first[0].UUID, outs)
	}
	if hooks.get(consumer.OutcomeDuplicate) != 1 {
		t.Errorf("the redelivery was not a duplicate: %v", hooks.n)
	}
}

// Any payload is handled: non-JSON and empty ones are rejected by the
// handler's own parsing (not by the middleware), a 1 MB one is applied.
func TestPayloadShapes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	big := strings.Repeat("x", 1_000_000)
	seen := map[string]int{}
	var mu sync.Mutex
	h := consumer.TxHandler(func(ctx context.Context, _ pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		seen[msg.UUID] = len(msg.Payload)
		mu.Unlock()
		return nil, nil
	})
	recs := []kafka.Message{
		{Value: []byte("not json"), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte("u-text")}}},
		{Value: nil, Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte("u-empty")}}},
		{Value: []byte(big), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte("u-big")}}},
	}
	w.produce(recs...)
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, handler: h})
	w.waitCaughtUp(group, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if seen["u-text"] != 8 || seen["u-empty"] != 0 || seen["u-big"] != len(big) || len(seen) != 3 {
		t.Fatalf("seen %v", seen)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Keys()); n != 3 {
		t.Fatalf("%d keys, want 3", n)
	}
}

// Lease mode: the handler runs outside any transaction (its effect leaves
// the database); duplicates do not run it, a failure releases the key so the
// redelivery takes it over, and the key counts the attempts.
func TestLeaseMode(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	exp, recs := commands(100)
	w.produce(append(recs, recs...)...)
	var mu sync.Mutex
	effects, calls := map[string]int{}, map[string]int{}
	h := func(msg *message.Message) ([]*message.Message, error) {
		if _, ok := consumer.Tx(msg); ok {
			return nil, errors.New("a transaction in lease mode")
		}
		mu.Lock()
		defer mu.Unlock()
		calls[msg.UUID]++
		if calls[msg.UUID] == 1 && msg.UUID[0]%4 == 0 {
			return nil, errors.New("payment API timed out")
		}
		effects[msg.UUID]++ // the external call succeeded
		return nil, nil
	}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, handler: h, cfg: &consumer.Config{Scope: "payments", Lease: 30 * time.Second}})
	w.waitCaughtUp(group, 2*time.Minute)
	mu.Lock()
	defer mu.Unlock()
	retried := 0
	for u := range exp {
		if effects[u] != 1 {
			t.Errorf("%s: external effect ran %d times", u, effects[u])
		}
		if calls[u] > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Fatal("no handler failure was injected")
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Keys() + " WHERE scope = 'payments' AND status = 'COMPLETED'"); n != len(exp) {
		t.Fatalf("%d completed keys, want %d", n, len(exp))
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Keys() + " WHERE attempts = 2"); n != retried {
		t.Fatalf("%d keys with 2 attempts, want %d (one per failed first attempt)", n, retried)
	}
}

// nackedAlready reports whether msg was nacked.
func nackedAlready(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}

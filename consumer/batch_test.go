package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// batchHandler applies a batch set-based: one statement for the balances,
// one for the application counts; each message emits one event with a
// fresh UUID. fail, when set, fails the batch after its writes.
func (w *world) batchHandler(calls *atomic.Int64, fail func(msgs []*message.Message) error) consumer.BatchHandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		if calls != nil {
			calls.Add(1)
		}
		accounts, amounts, uuids := make([]string, len(msgs)), make([]int64, len(msgs)), make([]string, len(msgs))
		outs := make([][]*message.Message, len(msgs))
		for i, msg := range msgs {
			var c command
			if err := json.Unmarshal(msg.Payload, &c); err != nil {
				return nil, err
			}
			accounts[i], amounts[i], uuids[i] = c.Account, c.Amount, msg.UUID
			outs[i] = []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"applied":"`+msg.UUID+`"}`))}
		}
		b, a := w.db.Table("balances"), w.db.Table("applications")
		if _, err := tx.Exec(ctx, "INSERT INTO "+b+" (account, balance) SELECT account, sum(amount) FROM unnest($1::text[], $2::bigint[]) AS u(account, amount) "+
			"GROUP BY account ORDER BY account ON CONFLICT (account) DO UPDATE SET balance = "+b+".balance + excluded.balance", accounts, amounts); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+a+" (uuid, n) SELECT uuid, count(*) FROM unnest($1::text[]) AS uuid GROUP BY uuid ORDER BY uuid "+
			"ON CONFLICT (uuid) DO UPDATE SET n = "+a+".n + excluded.n", uuids); err != nil {
			return nil, err
		}
		if fail != nil {
			if err := fail(msgs); err != nil {
				return nil, err
			}
		}
		return outs, nil
	}
}

// startBatch runs a BatchConsumer on a kafkapubsub.Subscriber of w.topic,
// publishing outputs to w.out and dead letters to w.dlq.
func (w *world) startBatch(group string, h consumer.BatchHandlerFunc, cfg consumer.BatchConfig) (stop func()) {
	t := w.t
	t.Helper()
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: w.brokers, ConsumerGroup: group, NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, DrainTimeout: 5 * time.Second, Logger: quietLogger(),
		MaxInFlight: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Scope == "" {
		cfg.Scope = "ledger"
	}
	cfg.Publisher, cfg.DeadLetterTopic = w.pub, w.dlq
	if cfg.Outputs == nil {
		cfg.OutputTopic = w.out
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	bc, err := consumer.NewBatchConsumer(w.store, h, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := bc.Subscribe(ctx, sub, w.topic); err != nil {
			t.Errorf("batch consumer: %v", err)
		}
	}()
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

// Every command produced three times, shuffled, with a key reuse and a
// record without a UUID among them, on four partitions: each command is
// applied once; the duplicates re-publish the stored events; the key reuse
// and the keyless record are dead-lettered with their reasons.
func TestBatchAppliesOnceAndDeadLetters(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	exp, recs := commands(300)
	var all []kafka.Message
	for range 3 {
		all = append(all, recs...)
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	var reusedUUID string
	for u := range exp {
		reusedUUID = u
		break
	}
	reused := exp[reusedUUID]
	all = append(all, record(reusedUUID, reused.Account, 99999), record("", "acc-x", 5))
	w.produce(all...)
	hooks := &countingHooks{}
	var calls atomic.Int64
	group := kafkatest.Name("g")
	w.startBatch(group, w.batchHandler(&calls, nil), consumer.BatchConfig{Config: consumer.Config{Hooks: hooks}, MaxSize: 200})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if n := w.count("SELECT count(*) FROM "+w.db.Keys()+" WHERE source_topic = $1 AND source_offset >= 0", w.topic); n != len(exp) {
		t.Errorf("%d keys stored with their source, want %d", n, len(exp))
	}
	if a, d, r, k := hooks.get(consumer.OutcomeApplied), hooks.get(consumer.OutcomeDuplicate), hooks.get(consumer.OutcomeKeyReused),
		hooks.get(consumer.OutcomeInvalidKey); a != len(exp) || d != 2*len(exp) || r != 1 || k != 1 {
		t.Errorf("hooks: %d applied, %d duplicates, %d key reused, %d invalid keys; want %d, %d, 1, 1", a, d, r, k, len(exp), 2*len(exp))
	}
	if calls.Load() >= int64(len(all)) {
		t.Errorf("the handler ran %d times for %d records: no batching", calls.Load(), len(all))
	}
	// Each command's event three times (once, then re-published by its two
	// duplicates with the same UUID).
	events := w.readTopic(w.out)
	distinct := map[string]int{}
	for _, e := range events {
		distinct[header(e, kafkapubsub.UUIDHeader)]++
	}
	if len(events) != 3*len(exp) || len(distinct) != len(exp) {
		t.Errorf("%d events, %d distinct; want %d and %d", len(events), len(distinct), 3*len(exp), len(exp))
	}
	dead := w.readTopic(w.dlq)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[string(d.Value)] = header(d, middleware.ReasonForPoisonedKey)
	}
	if len(dead) != 2 || !strings.Contains(reasons[string(record(reusedUUID, reused.Account, 99999).Value)], "reused with a different payload") ||
		!strings.Contains(reasons[string(record("", "acc-x", 5).Value)], "invalid key") {
		t.Errorf("dead letters: %v, want the key reuse and the keyless record with their reasons", reasons)
	}
}

// fakeMsgs hands a BatchConsumer messages of one partition in order, as a
// Subscriber with several unacked messages would, and records their acks.
type fakeMsgs struct {
	msgs []*message.Message
}

func newFakeMsgs(n int, account func(i int) string) *fakeMsgs {
	f := &fakeMsgs{}
	for i := range n {
		payload, _ := json.Marshal(command{Account: account(i), Amount: int64(i + 1)})
		m := message.NewMessage(fmt.Sprintf("m-%03d", i), payload)
		m.SetContext(dedupe.ContextWithSource(context.Background(), dedupe.Source{Topic: "fake", Partition: 0, Offset: int64(i)}))
		f.msgs = append(f.msgs, m)
	}
	return f
}

// run feeds every message to c and waits until each was acked or nacked.
func (f *fakeMsgs) run(t *testing.T, c *consumer.BatchConsumer) (acked, nacked []int) {
	t.Helper()
	ch := make(chan *message.Message, len(f.msgs))
	for _, m := range f.msgs {
		ch <- m
	}
	close(ch)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Run(ctx, ch); err != nil {
		t.Fatal(err)
	}
	for i, m := range f.msgs {
		select {
		case <-m.Acked():
			acked = append(acked, i)
		case <-m.Nacked():
			nacked = append(nacked, i)
		default:
			t.Fatalf("message %d neither acked nor nacked", i)
		}
	}
	return acked, nacked
}

// recordingPublisher keeps what is published.
type recordingPublisher struct {
	mu   sync.Mutex
	msgs map[string][]*message.Message
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.msgs == nil {
		p.msgs = map[string][]*message.Message{}
	}
	p.msgs[topic] = append(p.msgs[topic], msgs...)
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) get(topic string) []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msgs[topic]
}

// A batch whose handler fails because of one message is split until that
// message is alone; it then takes the per-message path, which poisons it
// (MaxAttempts 1) to the dead-letter topic with its reason. Every other
// message is applied once, in batches; all are acked.
func TestBatchSplitsToThePoisonMessage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	f := newFakeMsgs(40, func(i int) string { return fmt.Sprint("acc-", i%5) })
	const bad = "m-023"
	failing := func(msgs []*message.Message) error {
		for _, m := range msgs {
			if m.UUID == bad {
				return errors.New("cannot apply " + bad)
			}
		}
		return nil
	}
	pub := &recordingPublisher{}
	hooks := &countingHooks{}
	var calls atomic.Int64
	c, err := consumer.NewBatchConsumer(w.store, w.batchHandler(&calls, failing), &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", MaxAttempts: 1, Hooks: hooks, Logger: quietLogger()},
		MaxSize:         40,
		MaxWait:         time.Second,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
		OutputTopic:     "out",
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, nacked := f.run(t, c)
	if len(acked) != 40 || len(nacked) != 0 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	exp := map[string]command{}
	for _, m := range f.msgs {
		if m.UUID != bad {
			var c command
			_ = json.Unmarshal(m.Payload, &c)
			exp[m.UUID] = c
		}
	}
	w.assertExactlyOnce(exp)
	dead := pub.get("dlq")
	if len(dead) != 1 || dead[0].UUID != bad || !strings.Contains(dead[0].Metadata.Get(middleware.ReasonForPoisonedKey), "cannot apply "+bad) {
		t.Fatalf("dead letters %v, want %s with its reason", dead, bad)
	}
	if n := len(pub.get("out")); n != 39 {
		t.Errorf("%d events published, want 39", n)
	}
	// 40 → 20+20 → the failing 20 splits into 10+10, 5+5, 3+2, 2+1, 1+1:
	// a dozen runs or so, not one per message.
	if calls.Load() > 20 {
		t.Errorf("the handler ran %d times", calls.Load())
	}
	if a, p := hooks.get(consumer.OutcomeApplied), hooks.get(consumer.OutcomePoisoned); a != 39 || p != 1 {
		t.Errorf("hooks: %d applied, %d poisoned; want 39 and 1", a, p)
	}
}

// A message that still fails on the per-message path (not poison yet) is
// nacked, and so is every message after it: they come back after it, in
// order. The messages before it are applied and acked.
func TestBatchNackKeepsOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	f := newFakeMsgs(30, func(int) string { return "acc-1" })
	const bad = "m-012"
	failing := func(msgs []*message.Message) error {
		for _, m := range msgs {
			if m.UUID == bad {
				return errors.New("not yet")
			}
		}
		return nil
	}
	pub := &recordingPublisher{}
	c, err := consumer.NewBatchConsumer(w.store, w.batchHandler(nil, failing), &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", Logger: quietLogger()},
		MaxSize:         30,
		MaxWait:         time.Second,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
		PerMessage:      []message.HandlerMiddleware{middleware.Retry{MaxRetries: 1, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}.Middleware},
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, nacked := f.run(t, c)
	if !slices.Equal(acked, seq(0, 12)) || !slices.Equal(nacked, seq(12, 30)) {
		t.Fatalf("acked %v, nacked %v; want 0-11 acked, 12-29 nacked", acked, nacked)
	}
	if n := w.applied(); n != 12 {
		t.Fatalf("%d applied, want 12", n)
	}
	if len(pub.get("dlq")) != 0 {
		t.Fatal("a message that may still succeed was dead-lettered")
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// With the outbox, a batch's outputs are written in its transaction; its
// duplicates write nothing more.
func TestBatchOutputsToOutbox(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	wr, err := outbox.NewWriter(&outbox.Config{Schema: w.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.NewBatchConsumer(w.store, w.batchHandler(nil, nil), &consumer.BatchConfig{
		Config:  consumer.Config{Scope: "ledger", Outputs: wr.Outputs("events"), Logger: quietLogger()},
		MaxSize: 50,
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second pass is all duplicates
		if acked, _ := newFakeMsgs(25, func(i int) string { return fmt.Sprint("acc-", i%3) }).run(t, c); len(acked) != 25 {
			t.Fatalf("acked %d of 25", len(acked))
		}
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_outbox")); n != 25 {
		t.Fatalf("%d outbox rows, want 25", n)
	}
	if n := w.applied(); n != 25 {
		t.Fatalf("%d applied, want 25", n)
	}
}

// Batch consumers share a group; one joins and one leaves while the
// stream is consumed: partitions move with acked messages above their
// watermark, which come back to the new owner as duplicates.
func TestBatchRebalanceMidStream(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 6)
	exp, recs := commands(3000)
	group := kafkatest.Name("g")
	slow := func([]*message.Message) error { time.Sleep(2 * time.Millisecond); return nil }
	cfg := consumer.BatchConfig{MaxSize: 50, Workers: 3}
	stop1 := w.startBatch(group, w.batchHandler(nil, slow), cfg)
	w.startBatch(group, w.batchHandler(nil, slow), cfg)
	w.produce(recs[:1500]...)
	testenv.WaitFor(t, time.Minute, "a third of the stream", func() bool { return w.applied() >= 1000 })
	w.startBatch(group, w.batchHandler(nil, slow), cfg)
	w.produce(recs[1500:]...)
	testenv.WaitFor(t, time.Minute, "half of the stream", func() bool { return w.applied() >= 1750 })
	stop1()
	w.waitCaughtUp(group, 3*time.Minute)
	w.assertExactlyOnce(exp)
}

// A handler that names the failing message with a permanent error
// (MessageError) gets the batch cut at it: the messages before it and
// after it applied as two batches, and it dead-lettered in its place.
func TestBatchMessageErrorCutsTheBatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	f := newFakeMsgs(30, func(i int) string { return fmt.Sprint("acc-", i%4) })
	f.msgs[17].Payload = []byte("not a command")
	inner := w.batchHandler(nil, nil)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		calls.Add(1)
		for i, m := range msgs {
			if !json.Valid(m.Payload) {
				return nil, &consumer.MessageError{Index: i, Err: fmt.Errorf("%w: not JSON", dedupe.ErrInvalidPayload)}
			}
		}
		return inner(ctx, tx, msgs)
	}
	pub := &recordingPublisher{}
	c, err := consumer.NewBatchConsumer(w.store, h, &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", Logger: quietLogger()},
		MaxSize:         30,
		MaxWait:         time.Second,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
	})
	if err != nil {
		t.Fatal(err)
	}
	if acked, nacked := f.run(t, c); len(acked) != 30 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	if n := w.applied(); n != 29 {
		t.Fatalf("%d applied, want 29", n)
	}
	if dead := pub.get("dlq"); len(dead) != 1 || dead[0].UUID != "m-017" || !strings.Contains(dead[0].Metadata.Get(middleware.ReasonForPoisonedKey), "not JSON") {
		t.Fatalf("dead letters %v, want m-017 with its reason", dead)
	}
	// The whole batch, the 17 before, m-017 alone, the 12 after.
	if calls.Load() != 4 {
		t.Errorf("the handler ran %d times, want 4", calls.Load())
	}
}

// A MessageError that is not permanent cuts the batch at that message:
// the messages before it and after it are applied in two batches, and it
// alone takes the per-message path (here poisoned at its first attempt).
func TestBatchMessageErrorNotPermanentCuts(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	f := newFakeMsgs(30, func(i int) string { return fmt.Sprint("acc-", i%4) })
	inner := w.batchHandler(nil, nil)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		calls.Add(1)
		for i, m := range msgs {
			if m.UUID == "m-017" {
				return nil, &consumer.MessageError{Index: i, Err: errors.New("downstream refused it")}
			}
		}
		return inner(ctx, tx, msgs)
	}
	pub := &recordingPublisher{}
	c, err := consumer.NewBatchConsumer(w.store, h, &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", MaxAttempts: 1, Logger: quietLogger()},
		MaxSize:         30,
		MaxWait:         time.Second,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
	})
	if err != nil {
		t.Fatal(err)
	}
	if acked, nacked := f.run(t, c); len(acked) != 30 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	if n := w.applied(); n != 29 {
		t.Fatalf("%d applied, want 29", n)
	}
	if dead := pub.get("dlq"); len(dead) != 1 || dead[0].UUID != "m-017" {
		t.Fatalf("dead letters %v, want m-017", dead)
	}
	// The whole batch, the 17 before, m-017 alone, the 12 after.
	if calls.Load() != 4 {
		t.Errorf("the handler ran %d times, want 4", calls.Load())
	}
}

// A batch nacked whole for an infrastructure error holds its partition
// back: the later records of the same key, which the Subscriber's window
// has already delivered, are not applied before it, and everything is
// applied once, in offset order.
func TestBatchNackKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	var recs []kafka.Message
	for i := range 20 {
		recs = append(recs, record(fmt.Sprintf("m-%02d", i), "acc-1", 1))
	}
	w.produce(recs...)
	var mu sync.Mutex
	var order []string
	var calls atomic.Int64
	inner := w.batchHandler(nil, nil)
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		if calls.Add(1) <= 5 {
			return nil, dedupe.Retryable(errors.New("a dependency is down"))
		}
		outs, err := inner(ctx, tx, msgs)
		if err == nil {
			mu.Lock()
			for _, m := range msgs {
				order = append(order, m.UUID)
			}
			mu.Unlock()
		}
		return outs, err
	}
	stop := w.startBatch(kafkatest.Name("g"), h, consumer.BatchConfig{MaxSize: 5, MaxWait: 50 * time.Millisecond})
	defer stop()
	testenv.WaitFor(t, time.Minute, "all applied", func() bool { return w.applied() == 20 })
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("one key's records applied out of offset order: %v", order)
		}
	}
}

// A nack holds back its own topic's partition only: a message of another
// topic with the same partition number goes on and is applied.
func TestBatchHoldIsPerTopic(t *testing.T) {
	t.Parallel()
	store, send := oneByOne(t, "a-5")
	if send(msgAt("a-5", "a", 5)) {
		t.Fatal("a-5 acked, want nacked")
	}
	if !send(msgAt("b-7", "b", 7)) {
		t.Fatal("b-7 of another topic nacked: held back by a-5's partition")
	}
	if _, err := store.Get(context.Background(), dedupe.Key{Scope: "s", ID: "b-7"}); err != nil {
		t.Fatalf("b-7 has no key: %v", err)
	}
}

// A share group's record (its context carries its deliveries) holds
// nothing back when it is nacked: a share group has no order to keep, and
// a later record of its partition goes on and is applied, where a hold
// would nack it, and every other, for up to a minute, past their locks.
func TestBatchShareNackHoldsNothing(t *testing.T) {
	t.Parallel()
	_, send := oneByOne(t, "s-5")
	shared := func(m *message.Message) *message.Message {
		m.SetContext(dedupe.ContextWithDeliveries(m.Context(), 1))
		return m
	}
	if send(shared(msgAt("s-5", "t", 5))) {
		t.Fatal("s-5 acked, want nacked")
	}
	if !send(shared(msgAt("s-7", "t", 7))) {
		t.Fatal("s-7 nacked: held back by a nacked share record of its partition")
	}
}

// oneByOne runs a batch consumer of one message a batch whose handler
// fails the message failing with a retryable error, and returns its store
// and send, which hands it a message and says whether it was acked (false:
// nacked).
func oneByOne(t *testing.T, failing string) (*pgstore.Store, func(*message.Message) bool) {
	t.Helper()
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	h := func(_ context.Context, _ pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		if msgs[0].UUID == failing {
			return nil, dedupe.Retryable(errors.New("a dependency is down"))
		}
		return nil, nil
	}
	bc, err := consumer.NewBatchConsumer(store, h, &consumer.BatchConfig{Config: consumer.Config{Scope: "s", Logger: quietLogger()}, MaxSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	msgs := make(chan *message.Message)
	go func() { _ = bc.Run(ctx, msgs) }()
	return store, func(m *message.Message) bool {
		t.Helper()
		msgs <- m
		select {
		case <-m.Acked():
			return true
		case <-m.Nacked():
			return false
		case <-ctx.Done():
			t.Fatalf("%s neither acked nor nacked", m.UUID)
			return false
		}
	}
}

// msgAt is a message from topic's partition 0 at offset.
func msgAt(uuid, topic string, offset int64) *message.Message {
	m := message.NewMessage(uuid, []byte("p"))
	m.SetContext(dedupe.ContextWithSource(context.Background(), dedupe.Source{Topic: topic, Partition: 0, Offset: offset}))
	return m
}

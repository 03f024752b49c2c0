package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// eventLog records every Event, in order.
type eventLog struct {
	mu  sync.Mutex
	evs []consumer.Event
}

func (l *eventLog) OnMessage(_ context.Context, ev consumer.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
}

func (l *eventLog) events() []consumer.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]consumer.Event(nil), l.evs...)
}

// refusingStore is a store whose database refuses every connection.
func refusingStore(t *testing.T) *pgstore.Store {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now: connections are refused
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(port)
	cfg.ConnConfig.Fallbacks = nil // they name the real server
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, &pgstore.Config{Schema: "refused", RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// A database that refuses connections is an outage, as the Middleware
// classifies it: the batch is nacked whole, not split, and the hooks see one
// Event per message, each unavailable.
func TestBatchOutageOneOutcomePerMessage(t *testing.T) {
	t.Parallel()
	store := refusingStore(t)
	f := newFakeMsgs(5, func(int) string { return "acc-1" })
	hooks := &eventLog{}
	c, err := consumer.NewBatchConsumer(store, (&world{}).batchHandler(nil, nil), &consumer.BatchConfig{
		Config:  consumer.Config{Scope: "ledger", Hooks: hooks, Logger: quietLogger()},
		MaxSize: 5,
		MaxWait: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, nacked := f.run(t, c)
	if len(acked) != 0 || len(nacked) != 5 {
		t.Fatalf("acked %v, nacked %v; want all nacked", acked, nacked)
	}
	evs := hooks.events()
	per := map[string]int{}
	for _, ev := range evs {
		per[ev.Key]++
		if ev.Outcome != consumer.OutcomeUnavailable || ev.Err == nil {
			t.Errorf("message %s: outcome %s (err %v), want unavailable with the error", ev.Key, ev.Outcome, ev.Err)
		}
	}
	if len(evs) != 5 || len(per) != 5 {
		t.Fatalf("%d events for %d messages (%v), want one for each of the 5", len(evs), len(per), per)
	}
}

// fakeMsg is a message of partition 0 of topic "fake" at offset.
func fakeMsg(uuid string, payload []byte, offset int64) *message.Message {
	m := message.NewMessage(uuid, payload)
	m.SetContext(dedupe.ContextWithSource(context.Background(), dedupe.Source{Topic: "fake", Partition: 0, Offset: offset}))
	return m
}

// A message that the handler marks permanent (not JSON) is decided before
// a later copy of its key in the same batch, as one message at a time
// decides it: dead-lettered as an invalid payload, not as a key reused, and
// the later copy is applied.
func TestBatchPermanentDecidedInOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	valid, _ := json.Marshal(command{Account: "acc-k", Amount: 7})
	other, _ := json.Marshal(command{Account: "acc-x", Amount: 5})
	f := &fakeMsgs{msgs: []*message.Message{
		fakeMsg("u-k", []byte("not json"), 0),
		fakeMsg("u-x", other, 1),
		fakeMsg("u-k", valid, 2),
	}}
	inner := w.batchHandler(nil, nil)
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		var bad []error
		for i, m := range msgs {
			if !json.Valid(m.Payload) {
				bad = append(bad, &consumer.MessageError{Index: i, Err: fmt.Errorf("%w: not JSON", dedupe.ErrInvalidPayload)})
			}
		}
		if len(bad) > 0 {
			return nil, errors.Join(bad...)
		}
		return inner(ctx, tx, msgs)
	}
	pub := &recordingPublisher{}
	hooks := &countingHooks{}
	c, err := consumer.NewBatchConsumer(w.store, h, &consumer.BatchConfig{
		Config:          consumer.Config{Scope: "ledger", Hooks: hooks, Logger: quietLogger()},
		MaxSize:         3,
		MaxWait:         time.Second,
		Publisher:       pub,
		DeadLetterTopic: "dlq",
	})
	if err != nil {
		t.Fatal(err)
	}
	if acked, nacked := f.run(t, c); len(acked) != 3 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	if r, p := hooks.get(consumer.OutcomeKeyReused), hooks.get(consumer.OutcomeInvalidPayload); r != 0 || p != 1 {
		t.Errorf("hooks: %d key reused, %d invalid payload; want 0 and 1", r, p)
	}
	dead := pub.get("dlq")
	if len(dead) != 1 || string(dead[0].Payload) != "not json" ||
		!strings.Contains(dead[0].Metadata.Get(middleware.ReasonForPoisonedKey), "invalid payload") {
		var reasons []string
		for _, d := range dead {
			reasons = append(reasons, string(d.Payload)+": "+d.Metadata.Get(middleware.ReasonForPoisonedKey))
		}
		t.Fatalf("dead letters %q, want the malformed one as an invalid payload", reasons)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("balances") + " WHERE (account, balance) IN (('acc-k', 7), ('acc-x', 5))"); n != 2 {
		t.Errorf("%d of the 2 valid commands applied", n)
	}
}

// A message whose key is claimed elsewhere (a lease held by another
// worker, which dies) is applied before the later messages of its batch,
// as one message at a time would apply it: the batch is cut at it.
func TestBatchInFlightKeyKeepsOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	ctx := context.Background()
	seq := w.db.Table("seq")
	if _, err := w.db.Pool.Exec(ctx, "CREATE TABLE "+seq+" (uuid text NOT NULL, at bigserial)"); err != nil {
		t.Fatal(err)
	}
	f := newFakeMsgs(4, func(i int) string { return "acc-1" })
	held := f.msgs[1]
	fp, err := dedupe.RawFingerprint(held.Payload)
	if err != nil {
		t.Fatal(err)
	}
	// Another worker claims m-001 in lease mode and dies: its lease
	// expires while the per-message path retries.
	if _, err := w.store.Acquire(ctx, dedupe.Request{Key: dedupe.Key{Scope: "ledger", ID: held.UUID}, Fingerprint: fp}, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	inner := w.batchHandler(nil, nil)
	h := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, "INSERT INTO "+seq+" (uuid) VALUES ($1)", m.UUID); err != nil {
				return nil, err
			}
		}
		return inner(ctx, tx, msgs)
	}
	hooks := &eventLog{}
	retry := middleware.Retry{MaxRetries: 100, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond,
		Multiplier: 2, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
	c, err := consumer.NewBatchConsumer(w.store, h, &consumer.BatchConfig{
		Config:     consumer.Config{Scope: "ledger", Hooks: hooks, Logger: quietLogger()},
		MaxSize:    4,
		MaxWait:    time.Second,
		PerMessage: []message.HandlerMiddleware{retry.Middleware},
	})
	if err != nil {
		t.Fatal(err)
	}
	if acked, nacked := f.run(t, c); len(acked) != 4 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	inFlight := 0
	for _, ev := range hooks.events() {
		if ev.Key == held.UUID && ev.Outcome == consumer.OutcomeInFlight {
			inFlight++
		}
	}
	if inFlight == 0 {
		t.Fatalf("m-001 was never in flight: the test did not hold its key (events %v)", hooks.events())
	}
	rows, err := w.db.Pool.Query(ctx, "SELECT uuid FROM "+seq+" ORDER BY at")
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"m-000", "m-001", "m-002", "m-003"}; !slices.Equal(order, want) {
		t.Fatalf("applied in the order %v, want %v", order, want)
	}
}

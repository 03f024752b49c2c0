package consumer_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
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
		Scope: "ledger", MaxSize: 5, MaxWait: time.Second, Hooks: hooks, Logger: quietLogger(),
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

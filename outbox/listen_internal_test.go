package outbox

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

type discardPublisher struct{}

func (discardPublisher) Publish(string, ...*message.Message) error { return nil }
func (discardPublisher) Close() error                              { return nil }

// A LISTEN connection that goes silent (the peer gone without a word) is
// found out by its ping after StatementTimeout without a notification and
// replaced: the relay is woken when it listens again, and notifications
// reach it on the new connection. Without the ping its wait never ends and
// the relay hears nothing more.
func TestListenReplacesASilentConnection(t *testing.T) {
	t.Parallel()
	hole := pgtest.NewBlackHole(t)
	pool := hole.Pool(t, nil)
	schema := "listen_" + strconv.FormatUint(rand.Uint64(), 36) // the notifications' payload: no other test's
	r, err := NewRelay(pool, discardPublisher{}, &RelayConfig{Config: Config{Schema: schema}, StatementTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { defer close(done); r.listen(ctx, wake) }()
	t.Cleanup(func() { cancel(); <-done })
	waitWake := func(what string) {
		t.Helper()
		select {
		case <-wake:
		case <-time.After(time.Minute):
			t.Fatalf("no wake-up within a minute: %s", what)
		}
	}
	notify := func() {
		t.Helper()
		if _, err := pgtest.Pool(t).Exec(ctx, "SELECT pg_notify('exactly_outbox', $1)", schema+".exactly_outbox"); err != nil {
			t.Fatal(err)
		}
	}

	waitWake("the relay listens")
	notify()
	waitWake("a notification")
	hole.Swallow() // the LISTEN connection is dead for good
	hole.Release() // new connections work
	waitWake("the relay listens again, on a new connection")
	notify()
	waitWake("a notification on the new connection")
	if hole.Swallowed() == 0 {
		t.Fatal("no connection was swallowed")
	}
}

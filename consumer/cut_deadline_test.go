package consumer_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// A handler that returns nil shortly before its deadline must have its
// transaction committed. The read of the session that the middleware
// starts near the deadline opens a connection of its own; while that
// connection is slow to open (a remote server, TLS, a loaded server), the
// attempt waits for it after its handler returned, and the commit runs
// past the deadline.
func TestHandlerDoneBeforeDeadlineCommits(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	cfg, err := pgtest.Config(pgtest.RequireURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var slow atomic.Bool
	d := &net.Dialer{}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slow.Load() {
			time.Sleep(700 * time.Millisecond)
		}
		return d.DialContext(ctx, network, addr)
	}
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "s"})
	if err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	var returned atomic.Bool
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		dl, _ := msg.Context().Deadline()
		time.Sleep(time.Until(dl) - 150*time.Millisecond)
		returned.Store(true)
		return nil, nil
	})
	msg := message.NewMessage(uuid.NewString(), []byte("p"))
	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	msg.SetContext(mctx)
	_, herr := h(msg)
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Keys()+" WHERE key = $1", msg.UUID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if !returned.Load() {
		t.Fatal("the handler did not run")
	}
	if herr != nil || n != 1 {
		t.Fatalf("the handler returned nil 150ms before its deadline, yet the attempt failed: %v (%d keys stored)", herr, n)
	}
}

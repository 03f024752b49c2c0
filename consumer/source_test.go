package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// The key records the coordinates carried in the message context, or those
// that Config.Source returns for another Pub/Sub; KeyFromOffset keys by them.
func TestSourceIsRecordedFromContextOrConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }

	fromCtx, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "ctx", Logger: quietLogger()})
	msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
	msg.SetContext(dedupe.ContextWithSource(ctx, dedupe.Source{Topic: "t1", Partition: 3, Offset: 42}))
	if _, err := fromCtx.Middleware(noop)(msg); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(ctx, dedupe.Key{Scope: "ctx", ID: msg.UUID})
	if err != nil {
		t.Fatal(err)
	}
	if want := (dedupe.Source{Topic: "t1", Partition: 3, Offset: 42}); rec.Source != want {
		t.Fatalf("from context: recorded %+v, want %+v", rec.Source, want)
	}
	if id, err := consumer.KeyFromOffset(msg); err != nil || id != "t1/3/42" {
		t.Fatalf("KeyFromOffset = %q, %v", id, err)
	}

	other := dedupe.Source{Topic: "t2", Partition: 1, Offset: 7}
	fromCfg, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "cfg", Logger: quietLogger(),
		Source: func(*message.Message) (dedupe.Source, bool) { return other, true }})
	msg2 := message.NewMessage(watermill.NewUUID(), []byte("p"))
	msg2.SetContext(ctx)
	if _, err := fromCfg.Middleware(noop)(msg2); err != nil {
		t.Fatal(err)
	}
	rec, err = store.Get(ctx, dedupe.Key{Scope: "cfg", ID: msg2.UUID})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Source != other {
		t.Fatalf("from Config.Source: recorded %+v, want %+v", rec.Source, other)
	}
	if _, err := consumer.KeyFromOffset(msg2); err == nil {
		t.Fatal("KeyFromOffset without coordinates: no error")
	}
}

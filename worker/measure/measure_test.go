package measure_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker/measure"
)

// TestNoDedupeStoreAppliesEveryDelivery: without the claim, a redelivered
// message runs its handler again and commits its writes each time, per
// message and in batches, and no key is stored.
func TestNoDedupeStoreAppliesEveryDelivery(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	runs := db.Table("runs")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+runs+" (id text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	plain := measure.NoDedupeStore(store)
	write := func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+runs+" VALUES ($1)", id)
		return err
	}
	quiet := slog.New(slog.DiscardHandler)
	mw, err := consumer.NewMiddleware(plain, &consumer.Config{Scope: "m", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		return nil, write(ctx, tx, msg.UUID)
	}))
	for range 2 {
		if _, err := h(message.NewMessage("one", []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	bh, err := consumertest.NewBatchHandler(readable{plain, store}, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		for _, m := range msgs {
			if err := write(ctx, tx, m.UUID); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}, &consumer.BatchConfig{Config: consumer.Config{Scope: "b", Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, r := range bh.Run(ctx, t, message.NewMessage("two", []byte("y")), message.NewMessage("three", []byte("z"))) {
			if !r.Acked || r.Stored {
				t.Fatalf("batch message: acked %v, key stored %v (%v); want acked, no key", r.Acked, r.Stored, r.Err)
			}
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+runs).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Fatalf("%d writes committed, want 6 (every delivery applied)", n)
	}
}

// readable is a store that claims on one store and reads keys on another.
type readable struct {
	consumer.BatchStore
	keys *pgstore.Store
}

func (r readable) Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error) {
	return r.keys.Get(ctx, key)
}

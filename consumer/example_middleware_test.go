package consumer_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

// A message delivered twice is applied once: the handler runs in the
// middleware's transaction the first time; the second delivery is a
// duplicate that does not run it and gets the first run's outputs back,
// with their UUIDs, for the router to publish again.
func ExampleMiddleware_redelivered() {
	ctx := context.Background()
	pool, schema, drop := pgtest.ExampleDB() // your pool, and the schema your tables live in
	defer drop()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		panic(err)
	}
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id text PRIMARY KEY, item text NOT NULL)"); err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	dedup, err := consumer.NewMiddleware(store, &consumer.Config{
		Scope: "orders",
		Hooks: consumer.HooksFunc(func(_ context.Context, ev consumer.Event) { fmt.Println("outcome:", ev.Outcome) }),
	})
	if err != nil {
		panic(err)
	}
	handler := dedup.Middleware(consumer.TxHandler(
		func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id, item) VALUES ($1, $2)", msg.UUID, string(msg.Payload)); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage("placed-"+msg.UUID, []byte("placed"))}, nil
		}))

	for range 2 { // Kafka redelivers: a rebalance, a crash before the offset commit
		outs, err := handler(message.NewMessage("order-42", []byte("book")))
		if err != nil {
			panic(err)
		}
		fmt.Println("outputs:", outs[0].UUID, string(outs[0].Payload))
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// outcome: applied
	// outputs: placed-order-42 placed
	// outcome: duplicate
	// outputs: placed-order-42 placed
	// orders: 1
}

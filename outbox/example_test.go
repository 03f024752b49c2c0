package outbox_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
)

// Messages written in a transaction are published after, and only if, it
// commits: the relay publishes the committed one to any Watermill
// publisher (here an in-memory one; the Kafka Publisher in production), and
// the rolled-back one never leaves.
func ExampleWriter_WriteTx() {
	ctx := context.Background()
	pool, schema, drop := pgtest.ExampleDB() // your pool, and the schema your tables live in
	defer drop()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		panic(err)
	}
	w, err := outbox.NewWriter(&outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	write := func(uuid string, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		// ... the transaction's own writes ...
		msg := message.NewMessage(uuid, []byte(`{"order":"order-42"}`))
		msg.Metadata.Set(outbox.KeyMetadata, "order-42") // the Kafka key: one order, one partition, in order
		if err := w.WriteTx(ctx, tx, "orders.events", msg); err != nil {
			panic(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				panic(err)
			}
		}
	}
	write("evt-1", true)
	write("evt-2", false) // rolled back: never published

	pub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: schema}})
	if err != nil {
		panic(err)
	}
	n, err := relay.RunOnce(ctx) // Run(ctx) in production: it waits for notifications
	if err != nil {
		panic(err)
	}
	fmt.Println("published:", n)

	msgs, err := pub.Subscribe(ctx, "orders.events")
	if err != nil {
		panic(err)
	}
	msg := <-msgs
	msg.Ack()
	fmt.Println(msg.UUID, msg.Metadata.Get(outbox.KeyMetadata), string(msg.Payload))
	st, err := relay.Stats(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("pending:", st.Pending)
	// Output:
	// published: 1
	// evt-1 order-42 {"order":"order-42"}
	// pending: 0
}

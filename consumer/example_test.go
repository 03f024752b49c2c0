package consumer_test

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// A Watermill router whose handler applies each Kafka message exactly once.
// (Compile only: it needs Postgres and Kafka.)
func ExampleMiddleware() {
	ctx := context.Background()
	brokers := []string{"localhost:9092"}
	pool, _ := pgxpool.New(ctx, "postgres://postgres:postgres@localhost:5432/postgres")
	store, _ := pgstore.New(pool, nil) // after migrations.Migrate
	dedup, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger-consumer"})
	sub, _ := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger"})
	pub, _ := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
	poison, _ := middleware.PoisonQueueWithFilter(pub, "ledger.dlq", dedupe.IsPermanent)
	if err := dedup.Check(ctx); err != nil { // the key table is where the store looks
		panic(err)
	}
	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, "ledger.dlq"); err != nil {
		panic(err)
	}

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(
		poison,
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
			ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}.Middleware,
		middleware.Timeout(10*time.Second),
		dedup.Middleware,
		middleware.Recoverer,
	)
	router.AddHandler("ledger-consumer", "ledger.commands", sub, "ledger.events", pub,
		consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			if _, err := tx.Exec(ctx, "UPDATE ledger.accounts SET balance = balance + 1 WHERE id = $1", msg.Metadata.Get(kafkapubsub.MetadataKafkaKey)); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"applied":"`+msg.UUID+`"}`))}, nil
		}))
	_ = router.Run(ctx)
}

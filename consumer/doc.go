// Package consumer makes Watermill handlers on Kafka effectively-once.
//
// It holds the dedupe Middleware and a Watermill Subscriber and Publisher
// on segmentio/kafka-go (the only package that imports kafka-go).
//
//	store, _ := pgstore.New(pool, &pgstore.Config{Schema: "ledger"})
//	dedup, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger-consumer"})
//	sub, _ := consumer.NewSubscriber(&consumer.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger"})
//	pub, _ := consumer.NewPublisher(&consumer.PublisherConfig{Brokers: brokers})
//	poison, _ := middleware.PoisonQueueWithFilter(dlqPub, "ledger.dlq", dedupe.IsPermanent)
//
//	router.AddMiddleware(
//		poison,                // permanent errors (key reused, bad key or payload) → dead-letter topic, with the reason
//		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
//			ShouldRetry: consumer.ShouldRetry}.Middleware, // transient errors retried in process
//		middleware.Timeout(10*time.Second), // bounds the transaction too
//		dedup.Middleware,      // one transaction per attempt: claim, handler, complete, commit
//		middleware.Recoverer,  // a panic becomes an error inside the transaction, which rolls back
//	)
//	router.AddHandler("ledger-consumer", "ledger.commands", sub, "ledger.events", pub,
//		consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
//			// write with tx; return the events to publish
//		}))
//
// # Order of middleware
//
// Watermill runs middleware in the order added, the first outermost.
// The dedupe middleware goes inside Retry and Timeout, so that every retry is
// a fresh transaction and a timeout cancels the transaction, and outside
// Recoverer, so that a panic rolls the transaction back like any error.
// PoisonQueue goes outermost, with dedupe.IsPermanent as its filter: a key
// reused with another payload, a missing key (policy Reject) or a payload
// that cannot be fingerprinted is dead-lettered at once with its reason
// (metadata "reason_poisoned"); other errors are retried and then nacked,
// and the Subscriber delivers the same message again after a back-off.
//
// # Retention
//
// A key must outlive every way its message can come back. CheckTTL compares
// the store's TTL with the topic's retention.ms; call it at startup and
// warn (or refuse to start) when records outlive their keys.
//
// # Why it is exactly once
//
// The handler's writes and the key commit in one Postgres transaction, and
// the message is acked only after that commit: a crash before the commit
// loses nothing (the message comes back and the key is not there), a crash
// after it is absorbed (the message comes back and is a duplicate, whose
// stored output messages are re-published with their original UUIDs).
// The Subscriber commits a partition's offset only past acked messages and
// only within the consumer-group generation that fetched them.
package consumer

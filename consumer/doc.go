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
// # The Subscriber and transactional producers
//
// The Subscriber reads committed data by default
// (SubscriberConfig.Isolation = ReadCommitted), as the Java consumer with
// isolation.level=read_committed does: records of aborted transactions and
// the transaction markers (control records) are never delivered, and nothing
// past a partition's last stable offset is, so a partition waits behind a
// transaction that is still open until it commits or aborts. The offsets of
// hidden records are committed all the same: a partition whose last record
// is a marker is not left lagging. kafka-go does not filter transactions, so
// the Subscriber sends its own Fetch requests over kafka-go's Transport and
// filters each response (by producer ID, with the response's list of aborted
// transactions), as the Java consumer's CompletedFetch does.
//
// ReadUncommitted delivers every data record as soon as it is written. A
// handler then applies records of transactions that are later aborted (work
// that upstream rolled back, which the dedupe store cannot undo: to it they
// are ordinary messages), and sees records of open transactions before they
// are decided. Choose it only when no producer of the topic uses
// transactions, or when the handler wants exactly that.
//
// A rebalance drains each revoked partition's in-flight message (up to
// DrainTimeout, which must be below RebalanceTimeout) while heartbeats go
// on, then commits and rejoins: a handler slower than SessionTimeout does
// not get its member expelled. A Subscriber started before its topic exists
// logs at WARN until the topic appears, then joins its group and consumes.
//
// The Publisher sends records over 1 MiB in batches of their own, so a
// record up to the topic's max.message.bytes (and MaxRecordBytes) can be
// published, and dead-lettered; a record refused for its size fails with
// ErrRecordTooLarge, naming the limit it hit.
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

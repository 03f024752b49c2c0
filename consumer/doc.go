// Package consumer makes Watermill handlers on Kafka effectively-once.
//
// It holds the dedupe Middleware, which works with any Watermill Pub/Sub;
// package [github.com/exactly-go/exactly/kafkapubsub] is a Subscriber and
// Publisher on segmentio/kafka-go that reads committed data and puts each
// message's Kafka coordinates in its context ([dedupe.SourceFromContext]).
// With another Pub/Sub, set Config.Source to record its coordinates.
//
//	store, _ := pgstore.New(pool, &pgstore.Config{Schema: "ledger"})
//	dedup, _ := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger-consumer"})
//	sub, _ := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger"})
//	pub, _ := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
//	poison, _ := middleware.PoisonQueueWithFilter(pub, "ledger.dlq", dedupe.IsPermanent)
//	if err := dedup.Check(ctx); err != nil { … } // the key table is where the store looks
//	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, "ledger.dlq"); err != nil { … } // the dead-letter topic exists
//
//	router.AddMiddleware(
//		poison, // permanent errors (key reused, bad key or payload, poison message, dedupe.Permanent) → dead-letter topic, with the reason
//		middleware.Timeout(10*time.Second), // bounds each attempt, the transaction included
//		dedup.Middleware,      // one transaction per attempt: claim, handler, complete, commit; other failures nacked
//		middleware.Recoverer,  // a panic becomes an error inside the transaction, which rolls back
//	)
//	router.AddHandler("ledger-consumer", "ledger.commands", sub, "ledger.events", pub, // AddHandler: the outputs reach the middleware
//		consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
//			if cmd.Amount <= 0 {
//				return nil, dedupe.Permanent(fmt.Errorf("amount %d: want > 0", cmd.Amount)) // dead-lettered, never retried
//			}
//			// write with tx; return the events to publish
//		}))
//
// # Order of middleware
//
// Watermill runs middleware in the order added, the first outermost:
// PoisonQueue, Timeout, the dedupe middleware, Recoverer (with a Retry,
// between PoisonQueue and Timeout).
//
//   - PoisonQueue outermost, built with middleware.PoisonQueueWithFilter
//     and dedupe.IsPermanent as its filter: a key reused with another
//     payload, a missing key (policy Reject), a payload that cannot be
//     fingerprinted, a result over the store's limit, a poison message and
//     an error the handler marked with dedupe.Permanent are dead-lettered
//     with their reason (metadata "reason_poisoned") and acked. These are
//     the only errors the middleware returns under a router: any other
//     failure (the handler's own, below Config.MaxAttempts; the
//     database's; a configuration error) rolls back, and the middleware
//     nacks the message itself and returns no error, so the router's Ack
//     is refused and the Subscriber delivers the message again after its
//     back-off. So even Watermill's usual middleware.PoisonQueue, which
//     dead-letters every error it sees, never dead-letters an outage.
//   - A Retry adds nothing under a router, since no error that a retry
//     could fix reaches it; it may be left out. Kept, it needs
//     ShouldRetry: consumer.ShouldRetry, or it retries permanent errors,
//     which no retry can fix: the middleware then answers each retry at
//     once with the same error (the handler does not run again), names
//     ShouldRetry in it and logs it at ERROR. Called by code of its own
//     (not a router), the middleware returns every error, for the caller
//     to nack, and a Retry there also needs ResetContextOnRetry: true;
//     without it, Retry hands every attempt after the first the context
//     that Timeout cancelled when the first ended, and the middleware
//     refuses such an attempt with an error wrapping
//     dedupe.ErrMisconfigured that says so.
//   - Timeout outside the dedupe middleware, so that it bounds each attempt
//     (claim, handler and commit) and a cancelled attempt rolls back.
//   - The dedupe middleware inside all of them, so that every attempt is a
//     fresh transaction. Anything between it and the handler that runs the
//     handler twice (a Retry) or swallows its error (a PoisonQueue) would
//     apply one attempt's writes on top of another's or commit a failed
//     one: TxHandler's transaction serves one call, and a swallowed error
//     rolls the transaction back, both with an error that names this order.
//   - Recoverer innermost, so that a panic rolls the transaction back like
//     any error. The middleware also recovers panics itself.
//
// Register the handler with router.AddHandler. router.AddConsumerHandler
// drops a handler's outputs before any middleware sees them: with
// Config.Outputs set, a TxHandler's outputs that never reach the middleware
// fail the message with an error wrapping dedupe.ErrMisconfigured that
// names AddHandler, logged at ERROR; its writes roll back and nothing is
// acked, rather than commit the command without its events.
//
// With the scope left to the handler's name, one router-level middleware
// serves every handler; with a fixed Config.Scope, it serves one handler
// per topic, and a second handler on the same topic is refused (see
// Config.Scope).
//
// # Poison messages and outages
//
// A failed attempt is the message's fault, or the infrastructure's, or the
// deployment's, and only the first may ever dead-letter it:
//
//   - A permanent error is the message's own: the claim's (key reused,
//     invalid key or payload, result too large) or the handler's, marked
//     with dedupe.Permanent (a command that fails validation). It is
//     dead-lettered at once, with its reason, never retried.
//   - Configuration errors wrap dedupe.ErrMisconfigured: a table that is not
//     there (SQLSTATE class 42, 3F, 3D or 28, from the store or from the
//     handler's own SQL: run the migrations, or schema-qualify the name), a
//     shared scope, a misordered chain, outputs dropped before the outbox.
//     They are logged at ERROR with the fix and retried, never
//     dead-lettered. Middleware.Check and CheckTopics find the missing table
//     and dead-letter topic at start-up.
//   - Infrastructure failures are retried, never counted and never
//     dead-lettered, and logged at WARN (OutcomeUnavailable): transient
//     Postgres errors and lost connections (pgstore.IsRetryableError, SQLSTATE
//     classes 08, 53, 57, 58), a cancelled context (shutdown), errors that the
//     handler marked with dedupe.Retryable (a dependency of its own that is
//     down), and any error while the database does not answer a ping.
//   - An attempt cut by its deadline (middleware.Timeout; BatchConfig.Timeout
//     in batch mode) while its handler runs is judged by what the handler's
//     session was doing just before the deadline, read from
//     pg_stat_activity on a connection outside the pool: waiting for the
//     database (wait_event_type Lock, LWLock, IO, BufferPin or IPC: a lock that
//     another session holds, a slow disk, a long checkpoint) is the
//     infrastructure's, never counted however often it recurs; anything
//     else (the handler's own code between statements, a statement
//     computing, pg_sleep) is the message's, counted as below, so that a
//     message whose own work always outlasts the deadline ends on the
//     dead-letter topic and its partition moves on. A session that could
//     not be read counts as the infrastructure's, and so does a cut
//     outside the handler (the claim, the commit). Known limits: a handler
//     blocked on a connection whose peer is silently gone while new
//     connections work looks, from the server, like its own code between
//     statements (the session idle in its transaction), and counts; lease
//     mode has no session to read: a cut there counts as the handler's
//     error does.
//   - Anything else that the handler returns, or a panic, while the database
//     answers, counts against the message. After Config.MaxAttempts such
//     attempts (10 by default; in-process retries and redeliveries alike) the
//     middleware returns an error wrapping dedupe.ErrPoisonMessage with the
//     last error, which the PoisonQueue dead-letters, and the partition moves
//     on. A message whose permanent error comes back in a later delivery
//     was not dead-lettered (a missing dead-letter topic, no PoisonQueue, a
//     filter that does not pass dedupe.IsPermanent errors): that is logged
//     at ERROR with the fix, and the message is held, never dropped.
//
// No failure but a permanent one is ever dead-lettered or acked unapplied,
// whatever sits outside the middleware on a router: the middleware nacks
// the message itself and returns no error (see Order of middleware). Only
// the library acks: a handler (or a batch handler) gets a copy of its
// message with the same UUID, payload, metadata and context whose Ack and
// Nack reach nothing (the first such call is logged at WARN), since a
// handler's Ack would commit the offset of a message whose writes its
// error then rolls back. Return an error to have a message delivered again.
//
// A Scope belongs to one topic: a key that a message of another topic
// applied under the same Scope is not a duplicate but a sign of two
// consumers sharing a Scope, which would skip each other's messages. Such a
// message is held (nacked, not applied, not dead-lettered; the partition
// waits behind it) with an error wrapping dedupe.ErrMisconfigured that
// names the Scope and both topics, logged at ERROR, unless
// Config.AcrossTopics says that copies of the same commands reach the
// Scope on several topics on purpose (a topic moved to a new one). A
// message or key without a recorded topic is not judged; consumer groups
// are not compared (a new group on the same topic may take over a Scope).
//
// Each message gets one Outcome, passed to Hooks, and one log line at its
// level with its key, scope, topic, partition and offset: applied and
// duplicate (DEBUG: a replay redelivers whole topics; Config.LogDuplicates
// logs duplicates at INFO), in flight (INFO); key reused, invalid key,
// invalid payload, rejected, result too large, failed and unavailable
// (WARN); poisoned and misconfigured (ERROR).
//
// # Batch mode
//
// One transaction per message costs a commit (an fsync) per message. A
// [BatchConsumer] applies many messages per transaction: it reads a
// Subscriber's channel itself (Watermill's router has no batch handler),
// groups the messages into batches of up to BatchConfig.MaxSize, waiting at
// most BatchConfig.MaxWait after a batch's first message (each partition's
// messages stay contiguous and in offset order), and applies each batch
// with [pgstore.Store.DoBatch]: every key claimed in one statement, sorted
// by key; duplicates and key reuses filtered out; the [BatchHandlerFunc]
// run once, with the transaction, on the fresh messages, which it applies
// set-based (one UPDATE … FROM unnest(…) for many messages, with one
// source row per target row: an UPDATE … FROM that joins two rows to one
// target row updates it once, so two payments to one account in a batch
// must be summed first, see docs/batch.md and consumertest.BatchParity);
// the outputs stored for duplicates (or written to the outbox with
// BatchConfig.Outputs) in one more statement; one commit; then every message of the batch is
// acked, after its outputs were published.
//
//	bc, _ := consumer.NewBatchConsumer(store, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
//		// one statement for the whole batch; return nil or one slice of outputs per message
//	}, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger-consumer"}, MaxSize: 500, Publisher: pub, DeadLetterTopic: "ledger.dlq"})
//	sub, _ := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: "ledger"})
//	err := bc.Subscribe(ctx, sub, "ledger.commands")
//
// The Subscriber should deliver several unacked messages per partition in
// offset order (kafkapubsub.SubscriberConfig.MaxInFlight of at least
// MaxSize, KeyOrdered off); with one at a time, a batch holds at most one
// message per partition. BatchConfig.Workers runs several batches at once,
// each partition on one worker. A nacked message (a batch that failed for
// the infrastructure, a message the per-message path gives back) holds its
// partition: the later messages of that partition that the window has
// already delivered are nacked unapplied until the nacked one is delivered
// again, and the window then delivers them again in offset order, so a
// partition's order, and so every key's, holds across failures. (A hold
// whose message never comes back, because the partition moved to another
// member meanwhile, is dropped after a minute.)
//
// A message that cannot be applied in a batch takes the per-message path:
// the dedupe [Middleware], with the same configuration, wrapped in
// BatchConfig.PerMessage (by default the PoisonQueue for
// BatchConfig.DeadLetterTopic, a Retry and a Timeout, as on a router). It
// is taken by a message with no valid key or a payload that cannot be
// fingerprinted (the middleware applies Config.MissingKey; the batch is
// cut around it, so order holds), by a key reused with another payload
// (after the batch committed: a key reuse is never applied, so its order
// does not matter), by a key held in flight by a lease (the batch is cut
// there when fresh messages come after it, so none overtakes it), by a
// message that the handler names with a permanent MessageError (the batch
// is cut around it, so it is decided where it is, as one message at a time
// would decide it), and by the message that makes a batch fail: a batch
// whose handler fails (or panics) is rolled back and split in halves,
// applied in order, until the failing message is alone, which then
// retries, counts towards Config.MaxAttempts and is dead-lettered as poison
// with its reason (metadata "reason_poisoned"). When the per-message path
// nacks a message, the messages after it in the batch are nacked too, so
// that they come back after it. A batch that fails because of the
// infrastructure is classified as the Middleware classifies a message (a
// retryable error after pgstore.Config.MaxTxAttempts, a lost or refused
// connection, a database that does not answer a ping, shutdown: outcome
// unavailable; a configuration error: misconfigured) and nacked whole,
// never split or dead-lettered. BatchConfig.Timeout (30s by default)
// bounds each batch attempt (claims, handler and commit): a connection
// whose peer is silently gone blocks a call until its context ends. An
// attempt cut by Timeout while its handler waited for the database (see
// Poison messages and outages), or outside the handler, is unavailable
// too, nacked whole; one cut while its handler ran the messages' own work
// is split like a failing batch, so that the slow message ends alone on
// the per-message path, where its cuts count towards MaxAttempts; the
// default PerMessage's Timeout is the same. A batch handler's result of
// the wrong length (neither nil nor one slice per message) is a
// configuration error: logged at ERROR, nothing committed, the batch
// delivered again until the handler is fixed.
//
// Hooks receive one Event per message on both paths, with the message's own
// context (msg.Context()); on the batch path its Duration is the batch's. Duplicates re-publish their stored outputs with
// their UUIDs, as with the middleware.
//
// Without Watermill, [pgstore.Store.DoBatch] is the same protocol on a
// slice of requests: it answers per request (new, duplicate with its
// stored result, or the request's own error) and runs the function once on
// the fresh ones.
//
// # Why it is exactly once
//
// The handler's writes and the key commit in one Postgres transaction, and
// the message is acked only after that commit: a crash before the commit
// loses nothing (the message comes back and the key is not there), a crash
// after it is absorbed (the message comes back and is a duplicate, whose
// stored output messages are re-published with their original UUIDs).
// kafkapubsub.Subscriber commits a partition's offset only past acked
// messages and only within the consumer-group generation that fetched them.
//
// # Stores and tests
//
// The middleware runs on a [Store]: a [*pgstore.Store] in production. The
// consumertest package runs a handler through a real Middleware against one
// message at a time and reports its outcome, outputs and stored key, on
// consumertest.MemStore (in memory, for handlers that write no SQL) or on a
// pgstore.Store.
package consumer

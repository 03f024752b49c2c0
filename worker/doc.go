// Package worker runs an effectively-once Kafka consumer from a handler and
// a config: what River's Client is to River's workers.
//
// A [Worker] owns everything a correct program repeats, so that its one
// correct wiring is the only one:
//
//   - the Watermill router with the middleware chain in its one correct
//     order: a PoisonQueue that dead-letters only permanent errors
//     (dedupe.IsPermanent), a Timeout per attempt, the dedupe middleware
//     and a Recoverer (package consumer explains the order); every other
//     failure is nacked and delivered again after a back-off;
//   - the handler's registration, so that its outputs can never be dropped:
//     they go to Config.OutputTopic through the transactional outbox, in the
//     handler's transaction, and a handler that returns outputs with no
//     OutputTopic fails with a configuration error (retried, never
//     dead-lettered) instead of losing them;
//   - the outbox relay, on a publisher of its own, in a context that
//     outlives the consumer's drain, with a final flush when the worker
//     stops;
//   - key clean-up, one runner at a time across workers;
//   - the group's positions kept in Postgres with the effects (unless
//     Config.NoPositions), so that a database that loses its last commits
//     gets the messages behind them again;
//   - start-up: the migrations (Config.Migrate), the tables (exactly's and
//     Config.Tables), the topics (created with Config.CreateTopics), and
//     the key TTL against the topic's retention; while Postgres or Kafka
//     cannot be reached the worker waits with back-off;
//   - health ([Worker.Health], [Worker.HealthHandler] for /healthz), hooks
//     (Config.Hooks), plugins (Config.Plugins: one value each, which the
//     worker installs where it belongs, see [Plugin]; plugin/eotel's Tracer
//     gives whole traces through the outbox, plugin/eprom's Metrics the
//     dashboard's metrics), and a graceful stop when Run's context ends.
//
// Per-message and batch mode are two handler shapes of the same worker:
// Config.Handler applies one message per transaction, Config.BatchHandler
// a batch set-based in one (consumer.BatchConsumer).
//
//	w, err := worker.New(pool, &worker.Config{
//		Scope:       "top-ups", // part of every key: keep it stable
//		Brokers:     []string{"localhost:9092"},
//		Topic:       "ledger.commands",
//		OutputTopic: "ledger.events",
//		Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
//			// write with tx; return the events to publish
//		},
//	})
//	if err != nil { … }
//	return w.Run(ctx) // until ctx ends; then drains, commits and flushes the outbox
//
// The pieces underneath (consumer.Middleware, consumer.BatchConsumer,
// kafkapubsub, outbox, pgstore) stay public for programs that build their
// own router.
package worker

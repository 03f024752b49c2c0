// Package outbox is a transactional outbox: messages written in a Postgres
// transaction are published to Kafka (or any Watermill publisher) after, and
// only if, that transaction commits.
//
//	w, _ := outbox.NewWriter(&outbox.Config{Schema: "ledger"})
//	// in the transaction that changes state:
//	err := w.WriteTx(ctx, tx, "ledger.events", event)
//
//	relay, _ := outbox.NewRelay(pool, publisher, &outbox.RelayConfig{Config: outbox.Config{Schema: "ledger"}})
//	go relay.Run(ctx)
//
// With the dedupe middleware, consumer.Config{Outputs: w.Outputs("ledger.events")}
// writes a handler's output messages into the outbox in the handler's own
// transaction.
//
// The relay is at-least-once: a relay that dies after publishing a batch but
// before marking it publishes the batch again, with the same UUIDs, which
// consumers with the dedupe middleware absorb. Messages with the same
// partition key are published in id order, even with several relays: keys
// are spread over Lanes lanes and one relay at a time works a lane, under a
// session advisory lock. A relay wakes on LISTEN/NOTIFY (a trigger notifies
// on insert) and polls as a floor. A message the publisher rejects is
// retried with back-off, holding up only later messages of its own key, and
// after MaxAttempts it is marked DEAD (see Stats, and the table's
// last_error) so it no longer holds anything up.
//
// The NOTIFY has a price under many concurrent producers: Postgres
// serialises the commits of notifying transactions (they queue for one lock
// that is held through the commit's WAL flush). With 8 producers writing
// one row each, the trigger cost about a third of the throughput on a
// 2-core machine (scripts/pgbench.sh notify). A service with many producers
// can switch it off and let relays poll; nothing is lost, messages just wait
// up to PollInterval:
//
//	ALTER TABLE exactly_outbox DISABLE TRIGGER exactly_outbox_notify;
//	// and, in the relay: RelayConfig{PollInterval: 50 * time.Millisecond}
package outbox

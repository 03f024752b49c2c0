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
// transaction (register it with router.AddHandler: AddConsumerHandler
// discards outputs before any middleware sees them).
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
// A NOTIFY has a price under many concurrent producers: Postgres
// serialises the commits of notifying transactions (they queue for one lock
// that is held through the commit's WAL flush). So producers notify only
// while some relay sleeps: a relay with nothing to publish registers in
// exactly_outbox_waiters before it sleeps and removes itself when it wakes,
// and the insert trigger (deferred to commit) notifies only while a live
// registration exists. A busy relay polls on its own, so under load
// producers commit without the lock. With 8 producers writing one row each
// on a 2-core machine, notifying cost about 40 % of the throughput, and
// the trigger without notifying nothing this machine could tell from its
// noise (scripts/pgbench.sh notify). A
// producer that looked just before a relay registered did not notify; the
// relay checks for such rows after it registers, and its PollInterval bounds
// the wait of any it still misses. Nothing is ever lost: NOTIFY only wakes.
//
// Registrations expire (a relay that dies stops counting after about
// 2×PollInterval + 10s). An outbox table without a waiters table (a custom
// table, or one migrated only to 00002) keeps notifying as its trigger says.
// A relay built before migration 00003 never registers, so after that
// migration it is not notified and publishes on its PollInterval: upgrade
// relays with the migration. A producer in REPEATABLE READ or SERIALIZABLE
// looks for waiters in its snapshot, so it may miss a relay that registered
// after the snapshot was taken; that message too waits for PollInterval.
package outbox

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
// With the dedupe middleware, an Outputs field of
// [github.com/exactly-go/exactly/consumer.Config] set to
// [Writer.Outputs]("ledger.events") writes a handler's output messages into
// the outbox in the handler's own transaction (register it with
// router.AddHandler: AddConsumerHandler discards outputs before any
// middleware sees them).
//
// The relay is at-least-once: a relay that dies after publishing a batch but
// before marking it publishes the batch again, with the same UUIDs, which
// consumers with the dedupe middleware absorb. Several relays may run at
// once: keys are spread over [Lanes] lanes and one relay at a time works a
// lane, under a transaction-scoped advisory lock held by a transaction of
// the relay's, which ends at least every PollInterval. A relay wakes on LISTEN/NOTIFY (a
// trigger notifies on insert) and polls as a floor. Each of its database
// calls is bounded by [RelayConfig].StatementTimeout (30s by default), so a
// connection whose peer is silently gone fails a pass, which runs again on
// a new connection, instead of stopping the relay; its LISTEN connection is
// pinged after that long without a notification, and replaced when it does
// not answer.
//
// # Order
//
// Messages with the same partition key are published in commit order: the
// order in which the relay sees the producing transactions commit, and
// write order within a transaction. Rows that the relay first sees in the
// same read (their transactions committed between two of its reads) go out
// in the order they were written (their id order). So when transaction T1
// commits before T2 writes a message of the same key, T1's message comes
// first; two transactions that write one key at the same time may come out
// in either order. Producers that need an order between such transactions
// serialise them on the key (for example SELECT … FOR UPDATE on the key's
// row before WriteTx): then commit order and write order agree.
//
// Order holds whatever the publisher does with a call: a message goes to the
// publisher only after the publisher acknowledged every earlier message of
// its key. (kafka-go's Writer splits one call into several produce
// requests, by count and by its 1 MiB BatchBytes, and goes on with the next
// request after one fails; so one call never holds two messages of a key.)
// Each batch publishes in rounds, a round holding the first unpublished
// message of every key, one publisher call per topic. A retry may put a
// copy of a message after it on Kafka (a request that timed out but was
// written); never a later message of its key before it.
//
// # Failures
//
// A message the publisher rejects is retried with back-off
// ([RelayConfig].RetryBackoff, doubling to MaxRetryBackoff) and holds up only
// later messages of its own key: the relay reads past a held key's rows to
// other keys', so a failing key delays other keys by nothing, and a lane
// whose rows are all held costs nothing until the first retry is due (the
// relay sleeps until then or PollInterval, whichever comes first).
//
// After [RelayConfig].MaxAttempts a message is marked DEAD (see
// [Relay.Stats], and the table's last_error), and it goes on holding the
// later messages of its key: they stay PENDING, so that no consumer ever sees
// a key's message without the ones before it. Stats.Lag grows while a key is
// held. An operator resolves a DEAD message by retrying it,
//
//	UPDATE exactly_outbox SET status = 'PENDING', attempts = 0, next_attempt_at = now() WHERE uuid = '…';
//
// or by giving up on it, which releases the key's later messages:
//
//	DELETE FROM exactly_outbox WHERE uuid = '…';
//
// Migration 00005 indexes the rows that hold a key; without it the relay
// works, more slowly.
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
// 2×PollInterval + 10s); a relay that stops, or whose registration timed
// out, removes it (once the server has ended the statement it cut). An outbox table without a waiters table (a custom
// table, or one migrated only to 00002) keeps notifying as its trigger says.
// A relay built before migration 00003 never registers, so after that
// migration it is not notified and publishes on its PollInterval: upgrade
// relays with the migration. A producer in REPEATABLE READ or SERIALIZABLE
// looks for waiters in its snapshot, so it may miss a relay that registered
// after the snapshot was taken; that message too waits for PollInterval.
package outbox

// Package pgstore is the [dedupe.Store] on Postgres (pgx/v5).
//
// # Transactional mode
//
// Claim, the handler's writes and completion run in one transaction: the
// caller's. [Store.Do] opens it for you:
//
//	store, err := pgstore.New(pool, &pgstore.Config{Schema: "ledger"})
//	...
//	req := dedupe.Request{Key: key, Fingerprint: dedupe.FingerprintOf(payload)}
//	claim, err := store.Do(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
//		_, err := tx.Exec(ctx, "UPDATE ledger.accounts SET balance = balance + $1 WHERE id = $2", amount, id)
//		return nil, err
//	})
//	// claim.Decision is dedupe.DecisionNew or dedupe.DecisionDuplicate;
//	// claim.Record.Result is what the first run returned.
//
// or, on a transaction of your own, [Store.ClaimTx] then [Store.CompleteTx]
// before Commit.
//
// A new key costs one statement before the handler and at most one after it
// (none when there is no result to store); a duplicate costs one. Do sends
// BEGIN and the claim in one round trip (a pgx batch), so its transaction
// costs no more round trips than one without deduplication; the pgx.Tx it
// hands to fn does all that pgx's does except LargeObjects. The claim:
//
//	WITH ins AS (
//	    INSERT INTO exactly_keys AS k (scope, key, fingerprint, status, attempts, source_topic,
//	                                   source_partition, source_offset, created_at, completed_at,
//	                                   locked_until, expires_at)
//	    VALUES ($1, $2, $3, 'COMPLETED', 1, $5, $6, $7, now(), now(), NULL, now() + ttl)
//	    ON CONFLICT (scope, key) DO NOTHING
//	    RETURNING true AS inserted, <columns>
//	)
//	SELECT *, clock_timestamp() FROM ins
//	UNION ALL
//	SELECT false, <columns>, clock_timestamp() FROM exactly_keys WHERE scope = $1 AND key = $2
//	    AND NOT EXISTS (SELECT FROM ins)
//
// A row with inserted = true means "new": the key is written COMPLETED at
// once, because nothing outside the transaction can see it before commit and
// a rollback removes it with the handler's writes. A concurrent claim of the
// same key waits on the uncommitted row inside INSERT … ON CONFLICT. When it
// wakes up after a commit, the row is not in its statement's snapshot, so no
// row comes back, and it reads the row, waiting for its lock:
//
//	SELECT false, <columns>, clock_timestamp() FROM exactly_keys WHERE scope = $1 AND key = $2 FOR UPDATE
//
// The stored row then goes through [dedupe.Decide]: same fingerprint is a
// duplicate (with the stored result), another fingerprint is a
// [*dedupe.KeyReusedError]. The result, when there is one, is stored with
//
//	UPDATE exactly_keys SET result = $3 WHERE scope = $1 AND key = $2 AND status = 'COMPLETED'
//
// Under REPEATABLE READ or SERIALIZABLE the waiting claim fails with a
// serialisation failure (SQLSTATE 40001) instead; it is marked retryable
// ([dedupe.IsRetryable]) and Do runs the transaction again, where it finds the
// duplicate. The default is READ COMMITTED.
//
// # Lease mode
//
// For handlers whose effects leave the database, [Store.Acquire] commits the
// key as PROCESSING with locked_until = now + lease; [Store.Complete] and
// [Store.Release] are fenced by the attempts count, so a worker whose lease
// was taken over gets [dedupe.ErrLeaseLost] instead of overwriting the new
// owner's state:
//
//	UPDATE exactly_keys SET attempts = attempts + 1, locked_until = clock_timestamp() + lease, …
//	WHERE scope = $1 AND key = $2 AND status = 'PROCESSING' AND attempts = $3
//	  AND locked_until <= clock_timestamp()
//
// [Store.DoLease] wraps the three. Once fn returned, its effect happened
// whatever became of the caller's context (a Timeout that fires after the
// payment went through), so Complete and Release run on a context of their
// own, bounded by LeaseFinishTimeout, and retry transient failures within it;
// Complete keeps the key for the Request's TTL, as the claim did.
//
// # Lost answers and configuration errors
//
// When the connection drops after COMMIT was sent, Do cannot know whether
// it committed: it runs the transaction again, and a key found COMPLETED
// with the completion time of the unanswered transaction is its own write,
// reported with the first decision (DecisionNew), not as a duplicate.
//
// A table that is not where Config.Schema and Config.Table say (SQLSTATE
// 42P01: the migrations did not run, or the schema is wrong) is a
// configuration error: it wraps [dedupe.ErrMisconfigured] and names the fix,
// and is neither retried nor permanent. [Store.Check] finds it at start-up.
//
// # Retention
//
// Keys expire TTL after completion ([Config.TTL], 7 days by default: Kafka's
// default retention). [Store.Cleanup] (or [Store.RunCleanup], on an interval)
// deletes expired keys in batches with FOR UPDATE SKIP LOCKED, so it never
// waits for (or holds up) a claim, and an advisory lock keeps it to one
// runner per table (behind a connection pooler, a transaction-scoped one,
// held on a second connection of the pool while it runs).
//
// Errors cross this package's boundary wrapped ("pgstore: claim s/k: …");
// transient ones are marked with [dedupe.Retryable].
package pgstore

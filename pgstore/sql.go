package pgstore

import "strings"

// The statements, with {T} standing for the schema-qualified table.
const (
	cols = `scope, key, fingerprint, status, result, attempts, source_topic, source_partition,
       source_offset, created_at, completed_at, locked_until, expires_at`

	// claimSQL inserts the key or, on conflict, reports the stored row: one
	// statement, one round trip. $4 is the status the key gets: COMPLETED in
	// a transaction (nothing outside it can see the row before commit) and
	// PROCESSING under a lease. Durations are in microseconds.
	//
	// When the conflicting row was committed by a transaction that this
	// statement waited for, the row is not in the statement's snapshot and
	// nothing comes back: the caller then runs lockSQL. The second branch
	// runs only when nothing was inserted (a one-time filter in the plan), so
	// a new key costs no extra index lookup.
	claimSQL = `WITH ins AS (
    INSERT INTO {T} AS k (scope, key, fingerprint, status, attempts, source_topic, source_partition,
                        source_offset, created_at, completed_at, locked_until, expires_at)
    VALUES ($1, $2, $3, $4::text, 1, $5, $6, $7, now(),
            CASE WHEN $4::text = 'COMPLETED' THEN now() END,
            CASE WHEN $4::text = 'PROCESSING' THEN clock_timestamp() + $8::float8 * interval '1 microsecond' END,
            now() + $9::float8 * interval '1 microsecond')
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true AS inserted, ` + cols + `
)
SELECT *, clock_timestamp() FROM ins
UNION ALL
SELECT false, ` + cols + `, clock_timestamp() FROM {T} WHERE scope = $1 AND key = $2
    AND NOT EXISTS (SELECT FROM ins)`

	// lockSQL reads the conflicting row, waiting for any transaction that
	// holds it.
	lockSQL = `SELECT false, ` + cols + `, clock_timestamp() FROM {T} WHERE scope = $1 AND key = $2 FOR UPDATE`

	// takeoverSQL claims a key whose lease expired, fenced by the attempts
	// count that the caller saw.
	takeoverSQL = `UPDATE {T} SET
    attempts = attempts + 1,
    status = $4::text,
    completed_at = CASE WHEN $4::text = 'COMPLETED' THEN now() END,
    locked_until = CASE WHEN $4::text = 'PROCESSING' THEN clock_timestamp() + $8::float8 * interval '1 microsecond' END,
    source_topic = $5, source_partition = $6, source_offset = $7,
    expires_at = now() + $9::float8 * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND status = 'PROCESSING' AND attempts = $3 AND locked_until <= clock_timestamp()
RETURNING false, ` + cols + `, clock_timestamp()`

	// resultSQL stores the result of a key claimed in the same transaction.
	resultSQL = `UPDATE {T} SET result = $3 WHERE scope = $1 AND key = $2 AND status = 'COMPLETED'`

	// completeSQL completes a leased key, if the lease is still ours.
	completeSQL = `UPDATE {T} SET status = 'COMPLETED', result = $4, completed_at = now(), locked_until = NULL,
    expires_at = now() + $5::float8 * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND status = 'PROCESSING' AND attempts = $3`

	// releaseSQL ends a lease now, so the next delivery takes the key over.
	releaseSQL = `UPDATE {T} SET locked_until = clock_timestamp()
WHERE scope = $1 AND key = $2 AND status = 'PROCESSING' AND attempts = $3`

	getSQL = `SELECT false, ` + cols + `, clock_timestamp() FROM {T} WHERE scope = $1 AND key = $2`

	// cleanupSQL deletes one batch of expired keys, skipping rows that a
	// claim holds so it never makes one wait.
	cleanupSQL = `DELETE FROM {T} WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {T}
    WHERE expires_at < now() AND (status = 'COMPLETED' OR locked_until < now())
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED))`
)

type queries struct {
	claim, lock, takeover, result, complete, release, get, cleanup string
}

func newQueries(table string) queries {
	r := strings.NewReplacer("{T}", table)
	return queries{
		claim: r.Replace(claimSQL), lock: r.Replace(lockSQL), takeover: r.Replace(takeoverSQL),
		result: r.Replace(resultSQL), complete: r.Replace(completeSQL), release: r.Replace(releaseSQL),
		get: r.Replace(getSQL), cleanup: r.Replace(cleanupSQL),
	}
}

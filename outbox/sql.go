package outbox

import "strings"

// The relay's and the writer's statements, with {T} standing for the
// schema-qualified outbox table and {W} for its waiters table. Durations
// are passed in microseconds.
const (
	// insertSQL writes one transaction's messages with one statement.
	insertSQL = `INSERT INTO {T} (topic, partition_key, uuid, metadata, payload, lane)
SELECT $1, k, u, m, p, l FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::bytea[], $6::smallint[]) AS t(k, u, m, p, l)`

	// heldSQL is true for a row whose key is held: the key has a DEAD row, or
	// a row that failed and waits for its next attempt. Only a key's first
	// pending row is ever published, so a failed row is its key's first
	// pending row and holds every later one. The index of migration 00005
	// covers exactly the rows this looks for.
	heldSQL = `o.partition_key IS NOT NULL AND EXISTS (SELECT FROM {T} h
    WHERE h.lane = o.lane AND h.partition_key = o.partition_key
      AND (h.status = 'DEAD' OR (h.status = 'PENDING' AND h.attempts > 0 AND h.next_attempt_at > now())))`

	// fetchSQL reads, from each lane in $1, its first $2 pending rows that
	// are due and whose key is not held, in id order. Rows of a held key are
	// skipped, so they never stand in front of other keys' rows. It locks no
	// row: the lanes' advisory locks keep other relays away. Rows in $3 (being
	// marked) are left out.
	fetchSQL = `SELECT o.id, o.lane, o.topic, coalesce(o.partition_key, ''), o.uuid, o.metadata, o.payload, o.attempts, o.created_at
FROM unnest($1::smallint[]) AS l(lane)
CROSS JOIN LATERAL (
    SELECT * FROM {T} o
    WHERE o.lane = l.lane AND o.status = 'PENDING' AND o.next_attempt_at <= now() AND o.id <> ALL($3::bigint[])
      AND NOT (` + heldSQL + `)
    ORDER BY o.id LIMIT $2) o`

	// dueSQL reports whether any row could be published now.
	dueSQL = `SELECT EXISTS (SELECT FROM {T} o WHERE o.status = 'PENDING' AND o.next_attempt_at <= now() AND NOT (` + heldSQL + `))`

	// nextRetrySQL is how long until the earliest failed row is due again
	// (NULL when none waits).
	nextRetrySQL = `SELECT extract(epoch FROM min(next_attempt_at) - clock_timestamp()) * 1e6 FROM {T}
WHERE status = 'PENDING' AND attempts > 0`

	publishedSQL = `UPDATE {T} SET status = 'PUBLISHED', published_at = now(), attempts = attempts + 1, last_error = NULL WHERE id = ANY($1)`
	deletedSQL   = `DELETE FROM {T} WHERE id = ANY($1)`

	// failedSQL counts a failed attempt and sets the next one, or moves the
	// row to DEAD after $4 attempts.
	failedSQL = `UPDATE {T} SET attempts = attempts + 1, last_error = $2,
    next_attempt_at = clock_timestamp() + $3::float8 * interval '1 microsecond',
    status = CASE WHEN attempts + 1 >= $4 THEN 'DEAD' ELSE status END
WHERE id = $1 RETURNING status`

	// lockLanesSQL takes, in the order given and until the transaction
	// ends, every lane of $2 that no other transaction holds, and returns
	// those it took.
	lockLanesSQL = `SELECT coalesce(array_agg(l ORDER BY o), '{}') FROM unnest($2::smallint[]) WITH ORDINALITY AS u(l, o)
WHERE pg_try_advisory_xact_lock($1::bigint + l)`
	waitLaneSQL = `SELECT pg_advisory_xact_lock($1::bigint + $2::smallint)`
	// lockTimeoutSQL bounds, for the transaction, how long waitLaneSQL waits
	// ($1 in milliseconds).
	lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`
	// resetLockTimeoutSQL gives the rest of the transaction the session's
	// lock_timeout back.
	resetLockTimeoutSQL = `SET LOCAL lock_timeout TO DEFAULT`

	cleanupSQL = `DELETE FROM {T} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {T}
    WHERE status = 'PUBLISHED' AND published_at < now() - $1::float8 * interval '1 microsecond' LIMIT 1000))`

	statsSQL = `SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'DEAD'),
    min(created_at) FILTER (WHERE status = 'PENDING') FROM {T}`

	hasWaitersSQL = `SELECT to_regclass($1) IS NOT NULL`

	// registerSQL records a relay about to sleep (and drops expired
	// registrations of others).
	registerSQL = `WITH expired AS (DELETE FROM {W} WHERE expires_at < clock_timestamp() AND relay <> $1)
INSERT INTO {W} (relay, expires_at) VALUES ($1, clock_timestamp() + $2::float8 * interval '1 microsecond')
ON CONFLICT (relay) DO UPDATE SET expires_at = EXCLUDED.expires_at`
	unregisterSQL = `DELETE FROM {W} WHERE relay = $1`

	listenSQL = `LISTEN exactly_outbox`
)

// queries holds the statements for one table.
type queries struct {
	insert, fetch, due, nextRetry, published, deleted, failed string
	cleanup, stats, register, unregister                      string
}

func newQueries(table, waiters string) queries {
	r := strings.NewReplacer("{T}", table, "{W}", waiters)
	return queries{
		insert: r.Replace(insertSQL), fetch: r.Replace(fetchSQL), due: r.Replace(dueSQL), nextRetry: r.Replace(nextRetrySQL),
		published: r.Replace(publishedSQL), deleted: r.Replace(deletedSQL), failed: r.Replace(failedSQL),
		cleanup: r.Replace(cleanupSQL), stats: r.Replace(statsSQL),
		register: r.Replace(registerSQL), unregister: r.Replace(unregisterSQL),
	}
}

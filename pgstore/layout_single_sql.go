package pgstore

// The single-table layout's statements (LayoutSingleTable), with {T} standing for
// the schema-qualified table exactly_keys.

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
    ` + claimInsertSQL + `
    RETURNING true AS inserted, ` + cols + `
)
SELECT *, clock_timestamp() FROM ins
UNION ALL
SELECT false, ` + cols + `, clock_timestamp() FROM {T} WHERE scope = $1 AND key = $2
    AND NOT EXISTS (SELECT FROM ins)`

	// claimNewSQL is claimSQL without its second branch (queries.claimNew).
	claimNewSQL = claimInsertSQL + `
    RETURNING true AS inserted, ` + cols + `, clock_timestamp()`

	// claimInsertSQL inserts the key, unless it is stored.
	claimInsertSQL = `INSERT INTO {T} AS k (scope, key, fingerprint, status, attempts, source_topic, source_partition,
                        source_offset, created_at, completed_at, locked_until, expires_at)
    VALUES ($1, $2, $3, $4::text, 1, $5, $6, $7, now(),
            CASE WHEN $4::text = 'COMPLETED' THEN now() END,
            CASE WHEN $4::text = 'PROCESSING' THEN clock_timestamp() + $8::float8 * interval '1 microsecond' END,
            now() + $9::float8 * interval '1 microsecond')
    ON CONFLICT (scope, key) DO NOTHING`

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

	// extendSQL moves the end of a lease that is still ours to now+$4.
	extendSQL = `UPDATE {T} SET locked_until = clock_timestamp() + $4::float8 * interval '1 microsecond'
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

// The batch statements, with {T} standing for the schema-qualified table.
const (
	// batchClaimSQL inserts every key from arrays, sorted by key. When it
	// inserted them all (the usual case) it answers one row, allInserted;
	// otherwise it answers the rows it inserted and the stored rows of those
	// that conflicted, when its snapshot shows them: the multi-key claimSQL.
	// $8 is the number of keys.
	batchClaimSQL = `WITH ins AS (
    INSERT INTO {T} AS k (scope, key, fingerprint, status, attempts, source_topic, source_partition,
                        source_offset, created_at, completed_at, locked_until, expires_at)
    SELECT u.scope, u.key, u.fp, 'COMPLETED', 1, u.topic, u.part, u.off, now(), now(), NULL,
           now() + u.ttl * interval '1 microsecond'
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::float8[])
         AS u(scope, key, fp, topic, part, off, ttl)
    ORDER BY u.scope COLLATE "C", u.key COLLATE "C"
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING ` + insertedCols + `
), n AS (SELECT count(*) AS n FROM ins)
` + allInserted + ` WHERE (SELECT n FROM n) = $8::int
UNION ALL
SELECT true, *, clock_timestamp() FROM ins WHERE (SELECT n FROM n) < $8::int
UNION ALL
SELECT false, ` + prefixedCols + `, clock_timestamp()
FROM {T} k JOIN unnest($1::text[], $2::text[]) AS u(scope, key) ON k.scope = u.scope AND k.key = u.key
WHERE (SELECT n FROM n) < $8::int`

	// batchLockSQL reads conflicting rows that batchClaimSQL's snapshot
	// did not show, locked, in key order.
	batchLockSQL = `SELECT false, ` + prefixedCols + `, clock_timestamp()
FROM {T} k JOIN unnest($1::text[], $2::text[]) AS u(scope, key) ON k.scope = u.scope AND k.key = u.key
ORDER BY k.scope COLLATE "C", k.key COLLATE "C"
FOR UPDATE OF k`

	// batchResultSQL stores the results of keys claimed in the same transaction.
	batchResultSQL = `UPDATE {T} AS k SET result = u.result
FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u(scope, key, result)
WHERE k.scope = u.scope AND k.key = u.key AND k.status = 'COMPLETED'`

	// insertedCols reads a row that the statement inserted in the
	// columns of cols, leaving out what the request already holds (its
	// fingerprint and source): claimBatch makes its claim from the request
	// and the row's created_at (insertedClaim).
	insertedCols = `k.scope, k.key, ''::text, k.status, NULL::bytea, k.attempts, NULL::text, NULL::int, NULL::bigint,
       k.created_at, k.completed_at, k.locked_until, k.expires_at`

	prefixedCols = `k.scope, k.key, k.fingerprint, k.status, k.result, k.attempts, k.source_topic, k.source_partition,
       k.source_offset, k.created_at, k.completed_at, k.locked_until, k.expires_at`
)

const (
	// statsSizeSQL counts the table's keys up to $1: a bounded scan.
	statsSizeSQL = `SELECT count(*) FROM (SELECT FROM {T} LIMIT $1) s`

	// statsExactSQL counts a small table.
	statsExactSQL = `SELECT count(*) FILTER (WHERE status = 'PROCESSING'),
       count(*) FILTER (WHERE status = 'COMPLETED'),
       count(*) FILTER (WHERE expires_at < now()),
       min(created_at),
       pg_total_relation_size($1::regclass)
FROM {T}`

	// statsEstimateSQL estimates a large table's counts from pg_class (the
	// row count as of the last VACUUM or ANALYZE, scaled to the table's
	// current size as the planner does) and pg_stats (the share of
	// PROCESSING keys, the share of expiry times already past, from the most
	// common values and the histogram); the expired
	// keys are counted through the expires_at index up to $4. $2 and $3 are
	// the schema and the table's names.
	statsEstimateSQL = `SELECT c.reltuples::float8, c.relpages::int8,
       pg_relation_size(c.oid) / current_setting('block_size')::int8,
       COALESCE((SELECT m.f FROM pg_stats ps
                 CROSS JOIN LATERAL unnest(ps.most_common_vals::text::text[], ps.most_common_freqs) AS m(v, f)
                 WHERE ps.schemaname = $2 AND ps.tablename = $3 AND ps.attname = 'status' AND m.v = 'PROCESSING'), 0)::float8,
       (SELECT count(*) FROM (SELECT FROM {T} WHERE expires_at < now() LIMIT $4) e),
       COALESCE((SELECT COALESCE((SELECT sum(m.f) FROM unnest(ps.most_common_vals::text::timestamptz[], ps.most_common_freqs) AS m(v, f)
                                  WHERE m.v < now()), 0)
                        + (1 - COALESCE((SELECT sum(f) FROM unnest(ps.most_common_freqs) f), 0))
                          * COALESCE((SELECT count(*) FROM unnest(ps.histogram_bounds::text::timestamptz[]) b WHERE b < now())::float8
                                     / nullif(cardinality(ps.histogram_bounds::text::timestamptz[]), 0), 0)
                 FROM pg_stats ps WHERE ps.schemaname = $2 AND ps.tablename = $3 AND ps.attname = 'expires_at'), 0)::float8,
       (SELECT created_at FROM {T} ORDER BY expires_at LIMIT 1),
       pg_total_relation_size(c.oid)
FROM pg_class c WHERE c.oid = $1::regclass`
)

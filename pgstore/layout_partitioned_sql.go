package pgstore

import "strings"

// The partitioned layout's statements (pgx named arguments), with {P} standing for the
// partitioned table (or the partition a statement names), {N} for the names table and {L} for the legacy table
// probed as the oldest generation (the statements without it leave its
// parts out), {G} for the guard of a statement on a time partition (attachedGuard). They answer in the legacy statements' columns, so one
// protocol (claim.go) runs on both layouts. Their arguments:
//
//	@scope scope name, @id ID (returned as they are; the legacy table's key)
//	@fp fingerprint (32 bytes), @status the status a claimed key gets
//	@topic topic code, @part partition, @off offset, @lease lease, @ttl TTL (microseconds)
//	@scode scope code, @kid kid, @kind kind, @idtext id_text, @tname topic name
//	@attempts the attempts count that fences an update, @result a result
const (
	// p2Cols reads a row of {P} aliased k in the legacy columns.
	p2Cols = `@scope::text, @id::text, ` + p2RowHead + p2TopicName + p2RowTail

	// p2InsCols is p2Cols for a row the statement inserted: its topic is
	// the request's.
	p2InsCols = `@scope::text, @id::text, ` + p2RowHead + `@tname::text` + p2RowTail

	// p2RowHead and p2RowTail read a row of {P} aliased k in the legacy
	// columns after the key, around its topic name.
	p2RowHead = `encode(k.fingerprint, 'hex'),
       CASE k.status WHEN 'C' THEN 'COMPLETED' ELSE 'PROCESSING' END, k.result, k.attempts::int,
       `
	p2RowTail = `, k.source_partition, k.source_offset, k.created_at,
       CASE WHEN k.status = 'C' THEN COALESCE(k.completed_at, k.created_at) END, k.locked_until, k.expires_at`

	// p2TopicName reads the name of the source topic of a row of {P}
	// aliased k (a row the statement inserted has the request's, @tname).
	p2TopicName = `(SELECT n.name FROM {N} n WHERE n.code = k.source_topic)`

	// p2Key matches the request's row in {P} aliased k, after {G}, the
	// guard of a statement on a time partition (attachedGuard).
	p2Key = `{G}k.scope = @scode AND k.kid = @kid AND k.kind = @kind::"char" AND (k.kind <> 't' OR k.id_text = @id)`

	// legacyLive matches the request's row in {L} aliased o while it is
	// live: not expired, or leased.
	legacyLive = `o.scope = @scope AND o.key = @id AND ` + legacyLiveRow

	p2ClaimSQL = `WITH /*old*/ins AS (
    ` + p2InsertSQL + `
    RETURNING true AS inserted, k.*
)
SELECT k.inserted, ` + p2InsCols + `, clock_timestamp() FROM ins k
UNION ALL
SELECT false, ` + p2Cols + `, clock_timestamp() FROM {P} k WHERE ` + p2Key + `
    AND NOT EXISTS (SELECT FROM ins)/*andnoold*/`

	// p2ClaimNewSQL is p2ClaimSQL without its second branch
	// (queries.claimNew), for a layout whose legacy table is not probed.
	p2ClaimNewSQL = p2InsertSQL + `
    RETURNING true AS inserted, ` + p2InsCols + `, clock_timestamp()`

	// p2InsertSQL inserts the key, unless it is stored (or, where
	// /*noold*/ is spliced, live in the legacy table).
	p2InsertSQL = `INSERT INTO {P} AS k (kid, created_at, expires_at, completed_at, locked_until, source_offset, source_partition,
                        scope, source_topic, attempts, kind, status, fingerprint, id_text)
    SELECT @kid, now(), now() + @ttl::float8 * interval '1 microsecond', NULL,
           CASE WHEN @status::text = 'PROCESSING' THEN clock_timestamp() + @lease::float8 * interval '1 microsecond' END,
           @off, @part, @scode, @topic, 1, @kind::"char", CASE WHEN @status::text = 'COMPLETED' THEN 'C' ELSE 'P' END::"char", @fp, @idtext
    WHERE {G}true/*noold*/
    ON CONFLICT (scope, kid, kind) DO NOTHING`

	p2LockSQL = `SELECT false, ` + p2Cols + `, clock_timestamp() FROM {P} k WHERE ` + p2Key + ` FOR UPDATE`

	p2TakeoverSQL = `WITH n AS (
    UPDATE {P} AS k SET
        attempts = k.attempts + 1,
        status = CASE WHEN @status::text = 'COMPLETED' THEN 'C' ELSE 'P' END::"char",
        completed_at = CASE WHEN @status::text = 'COMPLETED' THEN now() END,
        locked_until = CASE WHEN @status::text = 'PROCESSING' THEN clock_timestamp() + @lease::float8 * interval '1 microsecond' END,
        source_topic = @topic, source_partition = @part, source_offset = @off,
        expires_at = now() + @ttl::float8 * interval '1 microsecond'
    WHERE ` + p2Key + ` AND k.status = 'P' AND k.attempts = @attempts::int AND k.locked_until <= clock_timestamp()
    RETURNING k.*
)/*oldtakeover*/
SELECT false, ` + p2Cols + `, clock_timestamp() FROM n k/*oldtakeoverrow*/`

	// The legacy parts, spliced in where {L} is probed.
	p2OldCTE   = `old AS (SELECT false, ` + prefixedOldCols + `, clock_timestamp() FROM {L} o WHERE ` + legacyLive + `), `
	p2NoOld    = ` AND NOT EXISTS (SELECT FROM old)`
	p2AndNoOld = ` AND NOT EXISTS (SELECT FROM old)
UNION ALL
SELECT * FROM old`
	p2OldTakeover = `, o AS (
    UPDATE {L} AS o SET
        attempts = o.attempts + 1, status = @status::text,
        completed_at = CASE WHEN @status::text = 'COMPLETED' THEN now() END,
        locked_until = CASE WHEN @status::text = 'PROCESSING' THEN clock_timestamp() + @lease::float8 * interval '1 microsecond' END,
        source_topic = @tname, source_partition = @part, source_offset = @off,
        expires_at = now() + @ttl::float8 * interval '1 microsecond'
    WHERE o.scope = @scope AND o.key = @id AND o.status = 'PROCESSING' AND o.attempts = @attempts::int AND o.locked_until <= clock_timestamp()
        AND NOT EXISTS (SELECT FROM n)
    RETURNING false, ` + prefixedOldCols + `, clock_timestamp()
)`
	p2OldTakeoverRow = `
UNION ALL
SELECT * FROM o`

	prefixedOldCols = `o.scope, o.key, o.fingerprint, o.status, o.result, o.attempts, o.source_topic, o.source_partition,
       o.source_offset, o.created_at, o.completed_at, o.locked_until, o.expires_at`

	// p2UpdateSQL wraps an update of the request's row in {P} (n, SET
	// clause and extra WHERE in /*set*/ and /*where*/) and of its legacy
	// row when it has none in {P}, and counts the rows updated.
	p2UpdateSQL = `WITH n AS (UPDATE {P} AS k SET /*set*/ WHERE ` + p2Key + ` /*where*/ RETURNING 1)/*oldupdate*/
SELECT (SELECT count(*) FROM n)/*oldcount*/`
	p2OldUpdate = `, o AS (UPDATE {L} AS o SET /*oldset*/ WHERE o.scope = @scope AND o.key = @id /*oldwhere*/
    AND NOT EXISTS (SELECT FROM n) RETURNING 1)`
	p2OldCount = ` + (SELECT count(*) FROM o)`

	p2GetSQL = `SELECT i, s, id, fp, st, r, a, t, p, off, c, done, lk, e, now FROM (
    SELECT false AS i, ` + p2Cols + `, clock_timestamp(), 0 AS pref FROM {P} k WHERE ` + p2Key + `
    /*oldget*/) AS x(i, s, id, fp, st, r, a, t, p, off, c, done, lk, e, now, pref)
ORDER BY pref LIMIT 1`
	p2OldGet = `UNION ALL
    SELECT false, ` + prefixedOldCols + `, clock_timestamp(), 1 FROM {L} o WHERE o.scope = @scope AND o.key = @id`

	// p2BatchCols reads a row of {P} aliased k, claimed for the request in
	// u, in the legacy columns.
	p2BatchCols = `u.scope, u.id, ` + p2RowHead + p2TopicName + p2RowTail

	// p2BatchKey matches the row in {P} aliased k of the request in u.
	p2BatchKey = `k.scope = u.scode AND k.kid = u.kid AND k.kind = u.kind::"char" AND (k.kind <> 't' OR k.id_text = u.id)`

	// p2BatchClaimSQL is p2ClaimSQL for many keys, from arrays sorted in
	// the primary key's order: it inserts them all, COMPLETED. When it
	// inserted them all it answers one row, allInserted; otherwise the rows
	// it inserted and the stored rows of those that conflicted, when its
	// snapshot shows them ($12 is the number of keys). Each conflicting key
	// is read in its own partition (the lateral subquery is a parameterized
	// scan, pruned at run time).
	p2BatchClaimSQL = `WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int2[], $4::uuid[], $5::text[], $6::text[], $7::bytea[],
                         $8::int2[], $9::int4[], $10::int8[], $11::float8[])
        WITH ORDINALITY AS u(scope, id, scode, kid, kind, idtext, fp, topic, part, off, ttl, ord)
), ins AS (
    INSERT INTO {P} AS k (kid, created_at, expires_at, completed_at, locked_until, source_offset, source_partition,
                        scope, source_topic, attempts, kind, status, fingerprint, id_text)
    SELECT u.kid, now(), now() + u.ttl * interval '1 microsecond', NULL, NULL, u.off, u.part,
           u.scode, u.topic, 1, u.kind::"char", 'C', u.fp, u.idtext
    FROM u ORDER BY u.ord
    ON CONFLICT (scope, kid, kind) DO NOTHING
    RETURNING k.scope, k.kid, k.kind, k.id_text, k.created_at, k.expires_at
), n AS (SELECT count(*) AS n FROM ins)
` + allInserted + ` WHERE (SELECT n FROM n) = $12::int
UNION ALL
SELECT true, u.scope, u.id, '', 'COMPLETED', NULL::bytea, 1, NULL::text, NULL::int, NULL::bigint, k.created_at, k.created_at, NULL::timestamptz,
       k.expires_at, clock_timestamp()
FROM ins k JOIN u ON ` + p2BatchKey + `
WHERE (SELECT n FROM n) < $12::int
UNION ALL
SELECT false, ` + p2BatchCols + `, clock_timestamp()
FROM u CROSS JOIN LATERAL (SELECT * FROM {P} k WHERE ` + p2BatchKey + ` OFFSET 0) k
WHERE (SELECT n FROM n) < $12::int`

	// p2BatchInsertSQL is p2BatchClaimSQL without its answers: it inserts
	// the keys, COMPLETED, from arrays sorted in the primary key's order.
	// How many it inserted is its command tag, and the time they got is the
	// transaction's, now(), read by a statement of its own in the same round
	// trip (batchNowSQL): nothing is collected from the rows, and the key's
	// scope and ID travel only as the row stores them, so that a batch of new
	// keys (the usual batch) costs little more than the rows it writes. The
	// rows go in the arrays' order, so that concurrent batches lock their
	// keys in one order, without a sort: a scan of unnest's rows emits them
	// in that order, and an INSERT … SELECT never runs in parallel. When it
	// inserted fewer than all, the transaction is rolled back and
	// p2BatchClaimSQL claims the batch in a new one.
	p2BatchInsertSQL = `INSERT INTO {P} AS k (kid, created_at, expires_at, completed_at, locked_until, source_offset, source_partition,
                        scope, source_topic, attempts, kind, status, fingerprint, id_text)
SELECT u.kid, now(), now() + u.ttl * interval '1 microsecond', NULL, NULL, u.off, u.part,
       u.scode, u.topic, 1, u.kind::"char", 'C', u.fp, u.idtext
FROM unnest($1::int2[], $2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::int2[], $7::int4[], $8::int8[], $9::float8[])
    AS u(scode, kid, kind, idtext, fp, topic, part, off, ttl)
ON CONFLICT (scope, kid, kind) DO NOTHING`

	// batchNowSQL reads the transaction's time, after p2BatchInsertSQL.
	batchNowSQL = `SELECT now()`

	// p2BatchLockSQL reads, locked and in the arrays' order, the keys that
	// p2BatchClaimSQL's snapshot did not show.
	p2BatchLockSQL = `SELECT false, ` + p2BatchCols + `, clock_timestamp()
FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int2[], $4::uuid[], $5::text[], $6::text[])
          WITH ORDINALITY AS u(scope, id, scode, kid, kind, idtext, ord) ORDER BY ord) u
CROSS JOIN LATERAL (SELECT * FROM {P} k WHERE ` + p2BatchKey + ` OFFSET 0 FOR UPDATE) k`

	// p2BatchResultSQL stores the results of keys claimed in the same
	// transaction, in one statement: each key's row in {P} or, when it has
	// none there, its row in the legacy table {L} (a key live there was
	// claimed where it is). It answers how many rows it updated.
	p2BatchResultSQL = `WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::bytea[])
        WITH ORDINALITY AS u(scope, id, kid, kind, result, ord)
), n AS (
    UPDATE {P} AS k SET result = u.result FROM u JOIN {N} nm ON nm.name = u.scope
    WHERE k.scope = nm.code AND k.kid = u.kid AND k.kind = u.kind::"char" AND (k.kind <> 't' OR k.id_text = u.id)
        AND k.status = 'C'
    RETURNING u.ord
)/*oldbatchresult*/
SELECT (SELECT count(*) FROM n)/*oldcount*/`
	p2OldBatchResult = `, o AS (
    UPDATE {L} AS o SET result = u.result FROM u
    WHERE o.scope = u.scope AND o.key = u.id AND o.status = 'COMPLETED' AND NOT EXISTS (SELECT FROM n WHERE n.ord = u.ord)
    RETURNING 1)`

	// p2BatchLegacySQL lists the keys of a batch that are live in the
	// legacy table {L} (aliased o).
	p2BatchLegacySQL = `SELECT o.scope, o.key FROM {L} o JOIN unnest($1::text[], $2::text[]) AS u(scope, key)
    ON o.scope = u.scope AND o.key = u.key
WHERE ` + legacyLiveRow

	// p2CleanupSQL deletes one batch of expired keys from the partition
	// of keys that are not time-ordered ({P} is that partition here).
	p2CleanupSQL = `DELETE FROM {P} WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {P}
    WHERE expires_at < now() AND (status = 'C' OR locked_until < now())
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED))`
)

// newPartitionedNamedQueries builds the partitioned layout's statements on
// parent (the partitioned table or one of its partitions), with the legacy
// table's parts when legacy is not "" and guard ({G}: "" or attachedGuard's
// condition) before every condition on the key.
func newPartitionedNamedQueries(parent, names, legacy, guard string) queries {
	splice := func(stmt string, parts ...string) string {
		for i := 0; i+1 < len(parts); i += 2 {
			with := ""
			if legacy != "" {
				with = parts[i+1]
			}
			stmt = strings.ReplaceAll(stmt, parts[i], with)
		}
		return strings.NewReplacer("{P}", parent, "{N}", names, "{L}", legacy, "{G}", guard).Replace(stmt)
	}
	update := func(set, where, oldSet, oldWhere string) string {
		s := splice(p2UpdateSQL, "/*oldupdate*/", p2OldUpdate, "/*oldcount*/", p2OldCount)
		return strings.NewReplacer("/*set*/", set, "/*where*/", where, "/*oldset*/", oldSet, "/*oldwhere*/", oldWhere).Replace(s)
	}
	q := queries{
		claim:    splice(p2ClaimSQL, "/*old*/", p2OldCTE, "/*noold*/", p2NoOld, "/*andnoold*/", p2AndNoOld),
		lock:     splice(p2LockSQL),
		takeover: splice(p2TakeoverSQL, "/*oldtakeover*/", p2OldTakeover, "/*oldtakeoverrow*/", p2OldTakeoverRow),
		result: update("result = @result", "AND k.status = 'C'",
			"result = @result", "AND o.status = 'COMPLETED'"),
		complete: update(`status = 'C', result = @result, completed_at = now(), locked_until = NULL,
    expires_at = now() + @ttl::float8 * interval '1 microsecond'`, "AND k.status = 'P' AND k.attempts = @attempts::int",
			`status = 'COMPLETED', result = @result, completed_at = now(), locked_until = NULL,
    expires_at = now() + @ttl::float8 * interval '1 microsecond'`, "AND o.status = 'PROCESSING' AND o.attempts = @attempts::int"),
		release: update("locked_until = clock_timestamp()", "AND k.status = 'P' AND k.attempts = @attempts::int",
			"locked_until = clock_timestamp()", "AND o.status = 'PROCESSING' AND o.attempts = @attempts::int"),
		extend: update("locked_until = clock_timestamp() + @lease::float8 * interval '1 microsecond'",
			"AND k.status = 'P' AND k.attempts = @attempts::int",
			"locked_until = clock_timestamp() + @lease::float8 * interval '1 microsecond'",
			"AND o.status = 'PROCESSING' AND o.attempts = @attempts::int"),
		get:         splice(p2GetSQL, "/*oldget*/", p2OldGet),
		batchResult: splice(p2BatchResultSQL, "/*oldbatchresult*/", p2OldBatchResult, "/*oldcount*/", p2OldCount),
	}
	// While the legacy table is probed, a new key's claim reads it: there
	// is no claim that only inserts.
	q.claimNew = q.claim
	if legacy == "" {
		q.claimNew = splice(p2ClaimNewSQL, "/*noold*/", p2NoOld)
	}
	q.resultOne = oneRowSQL(q.result)
	return q
}

// newPartitionedQueries is newPartitionedNamedQueries with the statements
// on one key numbered (numberArgs).
func newPartitionedQueries(parent, names, legacy, guard string) queries {
	q := newPartitionedNamedQueries(parent, names, legacy, guard)
	q.positional = numberArgs(&q.claim, &q.claimNew, &q.lock, &q.takeover, &q.result, &q.complete, &q.release, &q.extend, &q.get, &q.resultOne)
	return q
}

const (
	// p2StatsExactSQL counts a small partitioned table ({P}) and its live
	// legacy keys ({L}, when probed).
	p2StatsExactSQL = `SELECT count(*) FILTER (WHERE status = 'P'), count(*) FILTER (WHERE status = 'C'),
       count(*) FILTER (WHERE expires_at < now()), min(created_at)
FROM (SELECT status::text AS status, expires_at, created_at FROM {P}
      /*legacy*/) k`
	p2StatsLegacy = `UNION ALL SELECT left(status, 1), expires_at, created_at FROM {L} o WHERE ` + legacyLiveRow

	legacyLiveRow = `(o.expires_at >= now() OR (o.status = 'PROCESSING' AND o.locked_until >= now()))`

	// p2StatsEstimateSQL estimates a large partitioned table from its
	// partitions' pg_class and pg_stats rows, as statsEstimateSQL does for
	// one table; expired keys are counted in the partition of keys that are
	// not time-ordered ({O}) up to $1 (a time partition's keys go with it).
	p2StatsEstimateSQL = `WITH parts AS (
    SELECT c.oid, c.relname, c.reltuples::float8 AS tuples, c.relpages::float8 AS relpages,
           pg_relation_size(c.oid)::float8 / current_setting('block_size')::int8 AS pages
    FROM pg_partition_tree($2::regclass) t JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf
), est AS (
    SELECT p.*, CASE WHEN p.tuples > 0 AND p.relpages > 0 THEN p.tuples / p.relpages * p.pages ELSE greatest(p.tuples, 0) END AS n,
           COALESCE((SELECT m.f FROM pg_stats ps
                     CROSS JOIN LATERAL unnest(ps.most_common_vals::text::text[], ps.most_common_freqs) AS m(v, f)
                     WHERE ps.schemaname = $3 AND ps.tablename = p.relname AND ps.attname = 'status' AND m.v = 'P'), 0) AS processing
    FROM parts p
)
SELECT COALESCE(sum(n), 0)::float8, COALESCE(sum(n * processing), 0)::float8,
       (SELECT count(*) FROM (SELECT FROM {O} WHERE expires_at < now() LIMIT $1) e),
       (SELECT min(created_at) FROM ((SELECT created_at FROM {O} ORDER BY expires_at LIMIT 1)
                                     UNION ALL SELECT min(created_at) FROM {P} WHERE kid < '10000000-0000-0000-0000-000000000000') o),
       COALESCE((SELECT sum(pg_total_relation_size(oid)) FROM parts), 0)::int8
FROM est`
)

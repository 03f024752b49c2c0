package pgstore

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// legacyBatchStmts are the legacy layout's batch statements.
func (s *Store) legacyBatchStmts(reqs []dedupe.Request, order []int) batchStmts {
	n := len(order)
	scopes, ids, fps := make([]string, n), make([]string, n), make([]string, n)
	topics, parts, offsets, ttls := make([]*string, n), make([]*int32, n), make([]*int64, n), make([]float64, n)
	for j, i := range order {
		r := reqs[i]
		scopes[j], ids[j], fps[j], ttls[j] = r.Key.Scope, r.Key.ID, string(r.Fingerprint), micros(s.ttl(r))
		if r.Source != (dedupe.Source{}) {
			src := r.Source
			topics[j], parts[j], offsets[j] = &src.Topic, &src.Partition, &src.Offset
		}
	}
	return batchStmts{
		order: order,
		claim: s.sql(batchClaimSQL), claimArgs: []any{scopes, ids, fps, topics, parts, offsets, ttls, n},
		lock: s.sql(batchLockSQL),
		lockArgs: func(js []int) []any {
			ls, li := make([]string, len(js)), make([]string, len(js))
			for k, j := range js {
				ls[k], li[k] = scopes[j], ids[j]
			}
			return []any{ls, li}
		},
	}
}

// legacyLive reads, in the transaction (sending its BEGIN first when
// begin), which keys of reqs at kept are live in the legacy table.
func (s *Store) legacyLive(ctx context.Context, tx pgx.Tx, legacy string, reqs []dedupe.Request, kept []int, begin bool) (map[dedupe.Key]bool, error) {
	scopes, ids := make([]string, len(kept)), make([]string, len(kept))
	for j, i := range kept {
		scopes[j], ids[j] = reqs[i].Key.Scope, reqs[i].Key.ID
	}
	live := make(map[dedupe.Key]bool)
	err := s.queryIn(ctx, tx, begin, strings.ReplaceAll(p2BatchLegacySQL, "{L}", legacy), []any{scopes, ids}, func(rows pgx.Rows) error {
		for rows.Next() {
			var k dedupe.Key
			if err := rows.Scan(&k.Scope, &k.ID); err != nil {
				rows.Close()
				return err
			}
			live[k] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.layoutError("read the legacy keys of a batch", err)
	}
	return live, nil
}

// sql returns one of the batch statements for the store's table.
func (s *Store) sql(stmt string) string { return strings.ReplaceAll(stmt, "{T}", s.table) }

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

	// allInserted is the one row that answers a batch claim whose every key
	// was inserted: no key (an invalid one) and the statement's time, now(),
	// which every inserted row got as created_at and completed_at.
	allInserted = `SELECT true, ''::text, ''::text, ''::text, 'COMPLETED'::text, NULL::bytea, 1, NULL::text, NULL::int, NULL::bigint,
       now(), now(), NULL::timestamptz, now(), clock_timestamp()`

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

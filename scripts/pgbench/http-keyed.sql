-- The statements httpkey's transactional mode sends for a new key on the
-- default (partitioned) layout, as pgx sends them: BEGIN, the key's lock and
-- the claim (an insert only) in one round trip
-- (pgstore.Store.BeginLockClaimTx), the handler's INSERT, then the
-- response's UPDATE and COMMIT in one round trip (CompleteCommitTx). The key is text (principal "0", a random UUID), so it
-- is kept in exactly_keys2_other by a hash, with its text. Copied from the
-- server's log of BenchmarkMiddleware (log_statement = all) on 2026-12-07:
-- copy them again when the claim's SQL changes.
\set a random(0, 72057594037927935)
\set b random(0, 4611686018427387903)
\set lock random(1, 4611686018427387903)
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT (CASE WHEN pg_try_advisory_xact_lock(:lock) THEN 'true' ELSE 'exactly: key lock held by another transaction' END)::boolean;
INSERT INTO exactly_pgbench.exactly_keys2_other AS k (kid, created_at, expires_at, completed_at, locked_until, source_offset, source_partition,
                        scope, source_topic, attempts, kind, status, fingerprint, id_text)
    SELECT ('ff' || lpad(to_hex(:a::bigint), 14, '0') || lpad(to_hex(:b::bigint), 16, '0'))::uuid, now(), now() + 604800000000::float8 * interval '1 microsecond', NULL,
           CASE WHEN 'COMPLETED'::text = 'PROCESSING' THEN clock_timestamp() + 0::float8 * interval '1 microsecond' END,
           NULL, NULL, 1, NULL, 1, 't'::"char", CASE WHEN 'COMPLETED'::text = 'COMPLETED' THEN 'C' ELSE 'P' END::"char",
           '\x3eb803225c7ba22e059b4593ef83492d0e5f3e2f5614a83780a22ee59c6c5d43'::bytea, '0:/' || :a || '-' || :b
    WHERE true
    ON CONFLICT (scope, kid, kind) DO NOTHING
    RETURNING true AS inserted, 'http'::text, ('0:/' || :a || '-' || :b)::text, encode(k.fingerprint, 'hex'),
       CASE k.status WHEN 'C' THEN 'COMPLETED' ELSE 'PROCESSING' END, k.result, k.attempts::int,
       NULL::text, k.source_partition, k.source_offset, k.created_at,
       CASE WHEN k.status = 'C' THEN COALESCE(k.completed_at, k.created_at) END, k.locked_until, k.expires_at, clock_timestamp();
\endpipeline
INSERT INTO exactly_pgbench.payments (amount) VALUES (1) RETURNING id;
\startpipeline
WITH n AS (UPDATE exactly_pgbench.exactly_keys2_other AS k SET result = '\x7b22737461747573223a3230312c22686561646572223a7b22436f6e74656e742d54797065223a5b226170706c69636174696f6e2f6a736f6e225d7d2c22626f6479223a2265794a766179493664484a315a58303d227d'::bytea
    WHERE k.scope = 1 AND k.kid = ('ff' || lpad(to_hex(:a::bigint), 14, '0') || lpad(to_hex(:b::bigint), 16, '0'))::uuid AND k.kind = 't'::"char"
        AND (k.kind <> 't' OR k.id_text = '0:/' || :a || '-' || :b) AND k.status = 'C' RETURNING 1)
SELECT (CASE WHEN (SELECT count(*) FROM n) = 1 THEN 'true' ELSE 'exactly: no row of the key claimed in this transaction to store the result with' END)::boolean;
COMMIT;
\endpipeline

-- The same transaction with pgstore's claim (a new key each time), BEGIN and
-- the claim sent in one round trip as Store.Do does.
\set id random(0, 999)
\set k random(1, 1000000000000)
\startpipeline
BEGIN;
WITH ins AS (
    INSERT INTO exactly_pgbench.exactly_keys AS k (scope, key, fingerprint, status, attempts, source_topic, source_partition,
                        source_offset, created_at, completed_at, locked_until, expires_at)
    VALUES ('bench', 'k-' || :k || '-' || :client_id, 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
            'COMPLETED', 1, 'commands', 0, :k, now(), now(), NULL, now() + interval '7 days')
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true AS inserted, scope, key, fingerprint, status, result, attempts, source_topic, source_partition,
              source_offset, created_at, completed_at, locked_until, expires_at
)
SELECT *, clock_timestamp() FROM ins
UNION ALL
SELECT false, scope, key, fingerprint, status, result, attempts, source_topic, source_partition,
       source_offset, created_at, completed_at, locked_until, expires_at, clock_timestamp()
FROM exactly_pgbench.exactly_keys WHERE scope = 'bench' AND key = 'k-' || :k || '-' || :client_id
    AND NOT EXISTS (SELECT FROM ins);
\endpipeline
UPDATE exactly_pgbench.accounts SET balance = balance + 1 WHERE id = :id;
COMMIT;

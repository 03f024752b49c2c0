-- The plain handler's transaction with the least key a store can keep for a
-- request: a row of a scope code, a random 16-byte ID (an Idempotency-Key is
-- usually a UUIDv4), the payload's SHA-256 and an expiry, no index besides
-- its primary key, inserted with ON CONFLICT DO NOTHING. No response is
-- stored: this bounds any store that writes a row per request.
\set a random(0, 72057594037927935)
\set b random(0, 4611686018427387903)
BEGIN;
INSERT INTO exactly_pgbench.least_keys (scope, kid, fingerprint, expires_at)
VALUES (1, ('ff' || lpad(to_hex(:a::bigint), 14, '0') || lpad(to_hex(:b::bigint), 16, '0'))::uuid,
        '\x3eb803225c7ba22e059b4593ef83492d0e5f3e2f5614a83780a22ee59c6c5d43'::bytea, now() + interval '7 days')
ON CONFLICT DO NOTHING;
INSERT INTO exactly_pgbench.payments (amount) VALUES (1) RETURNING id;
COMMIT;

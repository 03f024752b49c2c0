-- A producer's transaction that writes one outbox row (the same table without the
-- NOTIFY trigger: exactly_outbox_notify).
\set id random(0, 999)
BEGIN;
UPDATE exactly_pgbench.accounts SET balance = balance + 1 WHERE id = :id;
INSERT INTO exactly_pgbench.outbox_quiet (topic, partition_key, uuid, payload, lane)
VALUES ('events', 'acc-' || :id, 'evt-' || :id || '-' || random(), '\x7b7d', :id % 16);
COMMIT;

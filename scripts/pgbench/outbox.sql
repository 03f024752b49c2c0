-- A producer's transaction that writes one outbox row (the table has the
-- migration's NOTIFY trigger).
\set id random(0, 999)
BEGIN;
UPDATE exactly_pgbench.accounts SET balance = balance + 1 WHERE id = :id;
INSERT INTO exactly_pgbench.exactly_outbox (topic, partition_key, uuid, payload, lane)
VALUES ('events', 'acc-' || :id, 'evt-' || :id || '-' || random(), '\x7b7d', :id % 16);
COMMIT;

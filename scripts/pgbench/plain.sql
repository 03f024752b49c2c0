-- A message's transaction without deduplication: BEGIN, one UPDATE, COMMIT.
\set id random(0, 999)
BEGIN;
UPDATE exactly_pgbench.accounts SET balance = balance + 1 WHERE id = :id;
COMMIT;

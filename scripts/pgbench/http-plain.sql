-- A plain HTTP handler's transaction, as httpkey's benchmark has it
-- (BenchmarkMiddleware): BEGIN, one INSERT, COMMIT.
BEGIN;
INSERT INTO exactly_pgbench.payments (amount) VALUES (1) RETURNING id;
COMMIT;

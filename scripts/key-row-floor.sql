-- What a key costs in bytes, grown by random inserts as in production, for
-- the partitioned layout's row (as in exactly_keys2_other, where random and
-- text IDs go) and for the least row a key can have: a scope code, the ID as
-- a uuid, the payload's SHA-256 and an expiry. Each is measured with the
-- expiry index that retiring by DELETE needs, and the least row also
-- without it. 1M random UUIDs per table, in transactions of 500; expiries
-- increase, as the clock does. About 30 s:
--
--   psql "$TEST_DATABASE_URL" -f scripts/key-row-floor.sql
--
-- See docs/keys.md.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS exactly_key_row_floor CASCADE;
CREATE SCHEMA exactly_key_row_floor;
SET search_path = exactly_key_row_floor;
-- The columns of migrations/sql/00007_keys_partitioned.sql.
CREATE TABLE layout_row (
    kid uuid NOT NULL, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, completed_at timestamptz,
    locked_until timestamptz, source_offset bigint, source_partition integer, scope smallint NOT NULL,
    source_topic smallint, attempts smallint NOT NULL, kind "char" NOT NULL, status "char" NOT NULL,
    fingerprint bytea NOT NULL, id_text text, result bytea,
    PRIMARY KEY (scope, kid, kind));
CREATE INDEX ON layout_row (expires_at);
CREATE TABLE least_row (scope smallint NOT NULL, kid uuid NOT NULL, fingerprint bytea NOT NULL,
    expires_at timestamptz NOT NULL, PRIMARY KEY (scope, kid));
CREATE INDEX ON least_row (expires_at);
CREATE TABLE least_row_no_expiry_index (LIKE least_row INCLUDING CONSTRAINTS INCLUDING INDEXES);
DROP INDEX least_row_no_expiry_index_expires_at_idx;
DO $$
BEGIN
    FOR i IN 1..2000 LOOP
        INSERT INTO layout_row
        SELECT gen_random_uuid(), now(), clock_timestamp() + interval '7 days', NULL, NULL, 1000000 + i, 3, 1, 1, 1, 'u', 'C',
               sha256(random()::text::bytea), NULL, NULL
        FROM generate_series(1, 500);
        INSERT INTO least_row SELECT 1, gen_random_uuid(), sha256(random()::text::bytea), clock_timestamp() + interval '7 days'
        FROM generate_series(1, 500);
        INSERT INTO least_row_no_expiry_index SELECT 1, gen_random_uuid(), sha256(random()::text::bytea), clock_timestamp() + interval '7 days'
        FROM generate_series(1, 500);
        COMMIT;
    END LOOP;
END $$;
SELECT c.relname AS "table",
       round(pg_relation_size(c.oid)::numeric / 1e6, 1) AS heap,
       (SELECT string_agg(regexp_replace(x.indexrelid::regclass::text, '^.*\.', '') || ' ' ||
                          round(pg_relation_size(x.indexrelid)::numeric / 1e6, 1), ', ' ORDER BY x.indexrelid)
        FROM pg_index x WHERE x.indrelid = c.oid) AS indexes,
       round(pg_total_relation_size(c.oid)::numeric / 1e6, 1) AS bytes_per_key
FROM pg_class c
WHERE c.relnamespace = 'exactly_key_row_floor'::regnamespace AND c.relkind = 'r'
ORDER BY c.relname;
DROP SCHEMA exactly_key_row_floor CASCADE;

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

func (b *bench) prepare(ctx context.Context, name string, n int) (*pgstore.Store, error) {
	schema := fmt.Sprintf("keybench_%s_%s_%s", strings.ReplaceAll(b.layout, "-", "_"), b.ids, name)
	if _, err := b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return nil, err
	}
	if err := migrations.Migrate(ctx, b.pool, &migrations.Config{Schema: schema}); err != nil {
		return nil, err
	}
	_, _ = b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
	s, err := b.newStore(schema)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if b.layout == "partitioned" {
		if err := b.partitionPast(ctx, s); err != nil {
			return nil, err
		}
	}
	if err := b.fill(ctx, s, n); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+tbl(s)); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return nil, err
	}
	b.logf("%s table: %d keys in %v", name, n, time.Since(start).Round(time.Second))
	return s, nil
}

func (b *bench) newStore(schema string) (*pgstore.Store, error) {
	if b.layout == "partitioned" {
		return pgstore.New(b.pool, &pgstore.Config{Schema: schema, Layout: pgstore.LayoutPartitioned})
	}
	return pgstore.New(b.pool, &pgstore.Config{Schema: schema, Layout: pgstore.LayoutSingleTable})
}

// fill inserts n keys in claim order, a million per statement, as claims
// would have grown the table: random IDs land anywhere in the index,
// time-ordered ones at its end.
func (b *bench) fill(ctx context.Context, s *pgstore.Store, n int) error {
	const chunk = 1_000_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		stmt := b.fillSQL(s)
		if b.layout == "partitioned" {
			stmt = b.fillNewSQL(s)
		}
		if _, err := b.pool.Exec(ctx, stmt, lo, hi, n, span.Seconds()); err != nil {
			return err
		}
	}
	return nil
}

// fillSQL inserts the keys $1..$2 of $3, claimed at evenly spaced times
// over the $4 seconds that ended at midnight yesterday.
func (b *bench) fillSQL(s *pgstore.Store) string {
	at := `date_trunc('day', now()) - interval '1 day' - ($4::float8 * (1 - g::float8 / $3)) * interval '1 second'`
	id := `gen_random_uuid()::text`
	if b.ids == "v7" {
		// A UUIDv7 minted at the claim time.
		id = `(SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) || '-' || substr(h, 17, 4) || '-' || substr(h, 21, 12)
		      FROM (SELECT lpad(to_hex((extract(epoch FROM ` + at + `) * 1000)::int8), 12, '0') || '7' || substr(m, 1, 3) || '8' || substr(m, 4, 15) AS h
		            FROM (SELECT md5(g::text || random()::text) AS m) r) x)`
	}
	return `INSERT INTO ` + tbl(s) + ` (scope, key, fingerprint, status, created_at, completed_at, expires_at,
	        source_topic, source_partition, source_offset)
	SELECT 'bench', ` + id + `, encode(sha256(g::text::bytea), 'hex'), 'COMPLETED', ` + at + `, ` + at + `, ` + at + ` + interval '7 days',
	       'bench-topic', g % 12, g
	FROM generate_series($1::int, $2::int) g`
}

// tbl is the store's key table, schema-qualified.
func tbl(s *pgstore.Store) string {
	return pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()
}

func (b *bench) tableBytes(ctx context.Context, s *pgstore.Store) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, "SELECT COALESCE((SELECT sum(pg_total_relation_size(relid))::int8 FROM pg_partition_tree($1::regclass)), pg_total_relation_size($1::regclass))", tbl(s)).Scan(&n)
	return n, err
}

// partitionPast runs the store's maintenance with the layout's state moved
// back 8 days, so the time partitions cover the stored keys' claim times.
func (b *bench) partitionPast(ctx context.Context, s *pgstore.Store) error {
	state := pgx.Identifier{s.Config().Schema, "exactly_keys2_state"}.Sanitize()
	if _, err := b.pool.Exec(ctx, "UPDATE "+state+" SET low = date_trunc('day', now() - interval '9 days'), legacy = NULL"); err != nil {
		return err
	}
	_, err := s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1})
	return err
}

// fillNewSQL is fillSQL for the partitioned layout, encoding IDs as
// pgstore does: a UUIDv7 as is, a random UUID with bytes 0 and 6 swapped.
func (b *bench) fillNewSQL(s *pgstore.Store) string {
	schema := pgx.Identifier{s.Config().Schema}.Sanitize()
	at := `date_trunc('day', now()) - interval '1 day' - ($4::float8 * (1 - g::float8 / $3)) * interval '1 second'`
	kid := `(SELECT (substr(h, 13, 2) || substr(h, 3, 10) || substr(h, 1, 2) || substr(h, 15))::uuid
	        FROM (SELECT overlay(overlay(md5(g::text || random()::text) PLACING '4' FROM 13) PLACING '8' FROM 17) AS h) x)`
	kind := `'u'`
	if b.ids == "v7" {
		kid = `(SELECT (lpad(to_hex((extract(epoch FROM ` + at + `) * 1000)::int8), 12, '0') || '7' || substr(m, 1, 3) || '8' || substr(m, 4, 15))::uuid
		       FROM (SELECT md5(g::text || random()::text) AS m) r)`
		kind = `'7'`
	}
	return `WITH codes AS (
    INSERT INTO ` + schema + `.exactly_key_names (name) VALUES ('bench'), ('bench-topic') ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING code, name
)
INSERT INTO ` + tbl(s) + ` (kid, created_at, expires_at, source_offset, source_partition, scope, source_topic, attempts, kind, status, fingerprint)
SELECT ` + kid + `, ` + at + `, ` + at + ` + interval '7 days', g, g % 12,
       (SELECT code FROM codes WHERE name = 'bench'), (SELECT code FROM codes WHERE name = 'bench-topic'), 1, ` + kind + `, 'C',
       sha256(g::text::bytea)
FROM generate_series($1::int, $2::int) g`
}

func (b *bench) newID() string {
	if b.ids == "v7" {
		return uuid.Must(uuid.NewV7()).String()
	}
	return uuid.NewString()
}

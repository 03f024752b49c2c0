package pgstore

import (
	"context"
	"math"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// statsExactMax is the most keys that Stats counts exactly; past it, the
// counts are estimates from the table's statistics, so a call costs the
// same with a billion keys as with a hundred thousand.
const statsExactMax = 50_000

const (
	// statsSizeSQL counts the table's keys up to $1: a bounded scan.
	statsSizeSQL = `SELECT count(*) FROM (SELECT FROM {T} LIMIT $1) s`

	// statsExactSQL counts a small table.
	statsExactSQL = `SELECT count(*) FILTER (WHERE status = 'PROCESSING'),
       count(*) FILTER (WHERE status = 'COMPLETED'),
       count(*) FILTER (WHERE expires_at < now()),
       min(created_at),
       pg_total_relation_size($1::regclass)
FROM {T}`

	// statsEstimateSQL estimates a large table's counts from pg_class (the
	// row count as of the last VACUUM or ANALYZE, scaled to the table's
	// current size as the planner does) and pg_stats (the share of
	// PROCESSING keys, the share of expiry times already past, from the most
	// common values and the histogram); the expired
	// keys are counted through the expires_at index up to $4. $2 and $3 are
	// the schema and the table's names.
	statsEstimateSQL = `SELECT c.reltuples::float8, c.relpages::int8,
       pg_relation_size(c.oid) / current_setting('block_size')::int8,
       COALESCE((SELECT m.f FROM pg_stats ps
                 CROSS JOIN LATERAL unnest(ps.most_common_vals::text::text[], ps.most_common_freqs) AS m(v, f)
                 WHERE ps.schemaname = $2 AND ps.tablename = $3 AND ps.attname = 'status' AND m.v = 'PROCESSING'), 0)::float8,
       (SELECT count(*) FROM (SELECT FROM {T} WHERE expires_at < now() LIMIT $4) e),
       COALESCE((SELECT COALESCE((SELECT sum(m.f) FROM unnest(ps.most_common_vals::text::timestamptz[], ps.most_common_freqs) AS m(v, f)
                                  WHERE m.v < now()), 0)
                        + (1 - COALESCE((SELECT sum(f) FROM unnest(ps.most_common_freqs) f), 0))
                          * COALESCE((SELECT count(*) FROM unnest(ps.histogram_bounds::text::timestamptz[]) b WHERE b < now())::float8
                                     / nullif(cardinality(ps.histogram_bounds::text::timestamptz[]), 0), 0)
                 FROM pg_stats ps WHERE ps.schemaname = $2 AND ps.tablename = $3 AND ps.attname = 'expires_at'), 0)::float8,
       (SELECT created_at FROM {T} ORDER BY expires_at LIMIT 1),
       pg_total_relation_size(c.oid)
FROM pg_class c WHERE c.oid = $1::regclass`
)

// Stats implements dedupe.Store in constant time: up to 50,000 keys it
// counts them; past that, it estimates the counts from the table's
// statistics (Stats.Estimated), which autovacuum keeps within a few
// percent, and reads no more than a bounded number of rows.
func (s *Store) Stats(ctx context.Context) (dedupe.Stats, error) { return s.statsOn(ctx, s.pool) }

func (s *Store) statsOn(ctx context.Context, db DBTX) (dedupe.Stats, error) {
	var st dedupe.Stats
	var n int64
	if err := db.QueryRow(ctx, s.sql(statsSizeSQL), statsExactMax+1).Scan(&n); err != nil {
		return st, classify("stats", err)
	}
	if n <= statsExactMax {
		var oldest *time.Time
		err := db.QueryRow(ctx, s.sql(statsExactSQL), s.table).Scan(&st.Processing, &st.Completed, &st.Expired, &oldest, &st.TableBytes)
		if err != nil {
			return st, classify("stats", err)
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
		return st, nil
	}
	var (
		tuples, processingShare, expiredShare float64
		relPages, pages, expired              int64
		oldest                                *time.Time
	)
	err := db.QueryRow(ctx, s.sql(statsEstimateSQL), s.table, s.cfg.Schema, s.cfg.Table, statsExactMax+1).
		Scan(&tuples, &relPages, &pages, &processingShare, &expired, &expiredShare, &oldest, &st.TableBytes)
	if err != nil {
		return st, classify("stats", err)
	}
	st.Estimated = true
	total := float64(n) // never analysed: at least what was counted
	if tuples > 0 && relPages > 0 {
		total = math.Max(total, tuples/float64(relPages)*float64(pages))
	} else if tuples > 0 {
		total = math.Max(total, tuples)
	}
	st.Processing = int64(math.Round(total * processingShare))
	st.Completed = int64(math.Round(total)) - st.Processing
	st.Expired = expired
	if expired > statsExactMax {
		st.Expired = max(expired, int64(math.Round(total*expiredShare)))
	}
	if oldest != nil {
		st.Oldest = *oldest
	}
	return st, nil
}

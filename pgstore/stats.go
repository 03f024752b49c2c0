package pgstore

import (
	"context"
	"math"
	"strings"
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
	if s.part != nil {
		return s.partitionedStats(ctx, db)
	}
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

const (
	// p2StatsExactSQL counts a small partitioned table ({P}) and its live
	// legacy keys ({L}, when probed).
	p2StatsExactSQL = `SELECT count(*) FILTER (WHERE status = 'P'), count(*) FILTER (WHERE status = 'C'),
       count(*) FILTER (WHERE expires_at < now()), min(created_at)
FROM (SELECT status::text AS status, expires_at, created_at FROM {P}
      /*legacy*/) k`
	p2StatsLegacy = `UNION ALL SELECT left(status, 1), expires_at, created_at FROM {L} o WHERE ` + legacyLiveRow

	legacyLiveRow = `(o.expires_at >= now() OR (o.status = 'PROCESSING' AND o.locked_until >= now()))`

	// p2StatsEstimateSQL estimates a large partitioned table from its
	// partitions' pg_class and pg_stats rows, as statsEstimateSQL does for
	// one table; expired keys are counted in the partition of keys that are
	// not time-ordered ({O}) up to $1 (a time partition's keys go with it).
	p2StatsEstimateSQL = `WITH parts AS (
    SELECT c.oid, c.relname, c.reltuples::float8 AS tuples, c.relpages::float8 AS relpages,
           pg_relation_size(c.oid)::float8 / current_setting('block_size')::int8 AS pages
    FROM pg_partition_tree($2::regclass) t JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf
), est AS (
    SELECT p.*, CASE WHEN p.tuples > 0 AND p.relpages > 0 THEN p.tuples / p.relpages * p.pages ELSE greatest(p.tuples, 0) END AS n,
           COALESCE((SELECT m.f FROM pg_stats ps
                     CROSS JOIN LATERAL unnest(ps.most_common_vals::text::text[], ps.most_common_freqs) AS m(v, f)
                     WHERE ps.schemaname = $3 AND ps.tablename = p.relname AND ps.attname = 'status' AND m.v = 'P'), 0) AS processing
    FROM parts p
)
SELECT COALESCE(sum(n), 0)::float8, COALESCE(sum(n * processing), 0)::float8,
       (SELECT count(*) FROM (SELECT FROM {O} WHERE expires_at < now() LIMIT $1) e),
       (SELECT min(created_at) FROM ((SELECT created_at FROM {O} ORDER BY expires_at LIMIT 1)
                                     UNION ALL SELECT min(created_at) FROM {P} WHERE kid < '10000000-0000-0000-0000-000000000000') o),
       COALESCE((SELECT sum(pg_total_relation_size(oid)) FROM parts), 0)::int8
FROM est`
)

// partitionedStats is Stats for LayoutPartitioned: the partitioned table
// and, while it is probed, the legacy table's live keys (counted when
// small, else estimated as one table).
func (s *Store) partitionedStats(ctx context.Context, db DBTX) (dedupe.Stats, error) {
	var st dedupe.Stats
	p := s.part
	ls, err := p.layoutState(ctx, db)
	if err != nil {
		return st, err
	}
	r := strings.NewReplacer("{P}", p.parent, "{O}", p.other, "{L}", ls.legacy)
	var n int64
	size := `SELECT count(*) FROM (SELECT FROM {P} LIMIT $1) s`
	if ls.legacy != "" {
		size = `SELECT count(*) FROM (SELECT FROM {P} UNION ALL SELECT FROM {L} o WHERE ` + legacyLiveRow + ` LIMIT $1) s`
	}
	if err := db.QueryRow(ctx, r.Replace(size), statsExactMax+1).Scan(&n); err != nil {
		return st, classify("stats", err)
	}
	if n <= statsExactMax {
		exact := p2StatsExactSQL
		if ls.legacy != "" {
			exact = strings.Replace(exact, "/*legacy*/", p2StatsLegacy, 1)
		}
		var oldest *time.Time
		if err := db.QueryRow(ctx, r.Replace(exact)).Scan(&st.Processing, &st.Completed, &st.Expired, &oldest); err != nil {
			return st, classify("stats", err)
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
	} else {
		var total, processing float64
		var oldest *time.Time
		if err := db.QueryRow(ctx, r.Replace(p2StatsEstimateSQL), statsExactMax+1, p.parent, p.schema).
			Scan(&total, &processing, &st.Expired, &oldest, &st.TableBytes); err != nil {
			return st, classify("stats", err)
		}
		st.Estimated = true
		if ls.legacy == "" { // else n counted the legacy table's live keys too, which are added below
			total = math.Max(total, float64(n))
		}
		st.Processing = int64(math.Round(processing))
		st.Completed = int64(math.Round(total)) - st.Processing
		if oldest != nil {
			st.Oldest = *oldest
		}
		if ls.legacy != "" {
			old := *s
			old.part, old.table = nil, ls.legacy
			old.cfg.Table = ls.legacyName
			lst, err := old.statsOn(ctx, db)
			if err != nil {
				return st, err
			}
			st.Processing, st.Completed, st.Expired = st.Processing+lst.Processing, st.Completed+lst.Completed, st.Expired+lst.Expired
			if !lst.Oldest.IsZero() && (st.Oldest.IsZero() || lst.Oldest.Before(st.Oldest)) {
				st.Oldest = lst.Oldest
			}
		}
	}
	if st.TableBytes == 0 {
		if err := db.QueryRow(ctx, `SELECT COALESCE(sum(pg_total_relation_size(relid)), 0)::int8 FROM pg_partition_tree($1::regclass)`,
			p.parent).Scan(&st.TableBytes); err != nil {
			return st, classify("stats", err)
		}
	}
	return st, nil
}

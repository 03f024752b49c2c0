package pgstore

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// stats counts (or estimates) the partitioned table
// and, while it is probed, the legacy table's live keys (counted when
// small, else estimated as one table).
func (p *partitioned) stats(ctx context.Context, db DBTX) (dedupe.Stats, error) {
	var st dedupe.Stats
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
		return st, p.layoutError("stats", err)
	}
	if n <= statsExactMax {
		exact := p2StatsExactSQL
		if ls.legacy != "" {
			exact = strings.Replace(exact, "/*legacy*/", p2StatsLegacy, 1)
		}
		var oldest *time.Time
		if err := db.QueryRow(ctx, r.Replace(exact)).Scan(&st.Processing, &st.Completed, &st.Expired, &oldest); err != nil {
			return st, p.layoutError("stats", err)
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
	} else {
		var total, processing float64
		var oldest *time.Time
		if err := db.QueryRow(ctx, r.Replace(p2StatsEstimateSQL), statsExactMax+1, p.parent, p.schema).
			Scan(&total, &processing, &st.Expired, &oldest, &st.TableBytes); err != nil {
			return st, p.layoutError("stats", err)
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
			lst, err := newSingleTable(p.s, p.schema, ls.legacyName).stats(ctx, db)
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
			return st, p.layoutError("stats", err)
		}
	}
	return st, nil
}

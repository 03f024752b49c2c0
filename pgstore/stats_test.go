package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// Stats of a table too large to count reads a bounded number of rows
// (counted by Postgres itself, in the transaction's own statistics) and
// estimates the counts within a few percent.
func TestStatsDoesNotCountALargeTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const keys, processing, expired = 200_000, 20_000, 60_000
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("exactly_keys")+
		` (scope, key, fingerprint, status, locked_until, created_at, expires_at)
		SELECT 's', 'k' || g, repeat('a', 64),
		       CASE WHEN g % 10 = 0 THEN 'PROCESSING' ELSE 'COMPLETED' END,
		       CASE WHEN g % 10 = 0 THEN now() + interval '1 hour' END,
		       now() - interval '2 days',
		       CASE WHEN g % 10 IN (1, 2, 3) THEN now() - interval '1 day' ELSE now() + interval '1 day' END
		FROM generate_series(1, $1) g`, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "ANALYZE "+db.Table("exactly_keys")); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	st, err := s.l.stats(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	var read int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
		WHERE schemaname = $1 AND relname = 'exactly_keys'`, db.Schema).Scan(&read); err != nil {
		t.Fatal(err)
	}
	if limit := int64(3 * (statsExactMax + 1)); read > limit {
		t.Errorf("Stats read %d rows of a %d-key table; want at most %d", read, keys, limit)
	}
	near := func(got, want int64) bool {
		return float64(got) >= 0.95*float64(want) && float64(got) <= 1.05*float64(want)
	}
	if !st.Estimated || !near(st.Processing, processing) || !near(st.Completed, keys-processing) || !near(st.Expired, expired) ||
		st.Oldest.IsZero() || st.TableBytes <= 0 {
		t.Errorf("stats %+v; want about %d processing, %d completed, %d expired, estimated", st, processing, keys-processing, expired)
	}
}

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// parseBytes reads a memory cap as bench-keys.sh prints it (152M, 4G); 0
// if it cannot.
func parseBytes(v string) int64 {
	var n int64
	var unit string
	if _, err := fmt.Sscanf(v, "%d%s", &n, &unit); err != nil {
		return 0
	}
	switch strings.ToUpper(unit) {
	case "K":
		return n << 10
	case "M":
		return n << 20
	case "G":
		return n << 30
	}
	return 0
}

// floorBytes grows a table of the least row a key can have (a scope code,
// the ID as a uuid, the payload's SHA-256 and an expiry; with the expiry
// index that retiring by DELETE needs, or without it) by the same inserts
// fill makes, n keys, and returns its bytes per key, table and every index.
func floorBytes(ctx context.Context, pool *pgxpool.Pool, ids string, expiryIndex bool, n int) (float64, error) {
	const t = "keybench_floor.least_row"
	for _, q := range []string{"DROP SCHEMA IF EXISTS keybench_floor CASCADE", "CREATE SCHEMA keybench_floor",
		"CREATE TABLE " + t + " (scope smallint NOT NULL, kid uuid NOT NULL, fingerprint bytea NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (scope, kid))"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return 0, err
		}
	}
	if expiryIndex {
		if _, err := pool.Exec(ctx, "CREATE INDEX ON "+t+" (expires_at)"); err != nil {
			return 0, err
		}
	}
	at := `date_trunc('day', now()) - interval '1 day' - ($4::float8 * (1 - g::float8 / $3)) * interval '1 second'`
	kid := `gen_random_uuid()`
	if ids == "v7" {
		kid = `(SELECT (lpad(to_hex((extract(epoch FROM ` + at + `) * 1000)::int8), 12, '0') || '7' || substr(m, 1, 3) || '8' || substr(m, 4, 15))::uuid
		       FROM (SELECT md5(g::text || random()::text) AS m) r)`
	}
	const chunk = 1_000_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		if _, err := pool.Exec(ctx, `INSERT INTO `+t+` SELECT 1, `+kid+`, sha256(g::text::bytea), `+at+` + interval '7 days'
FROM generate_series($1::int, $2::int) g`, lo, hi, n, span.Seconds()); err != nil {
			return 0, err
		}
	}
	var bytes int64
	if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", t).Scan(&bytes); err != nil {
		return 0, err
	}
	_, err := pool.Exec(ctx, "DROP SCHEMA keybench_floor CASCADE")
	return float64(bytes) / float64(n), err
}

// targets prints the partitioned layout's targets, each beside its floor,
// for the cases that ran.
func targets(ctx context.Context, pool *pgxpool.Pool, res map[string]*result, floorKeys int) error {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	for _, t := range []struct {
		ids         string
		bound       float64
		expiryIndex bool
		floor       string
	}{
		{"v7", 150, false, "the least row, no expiry index (retired by dropping its partition)"},
		{"v4", 175, true, "the least row with its expiry index (retired by DELETE)"},
	} {
		r := res["partitioned/"+t.ids]
		if r == nil {
			continue
		}
		floor, err := floorBytes(ctx, pool, t.ids, t.expiryIndex, floorKeys)
		if err != nil {
			return err
		}
		fmt.Printf("bench-keys: target bytes_per_key ids=%s measured=%.0f target=<=%.0f floor=%.0f (%s; %d keys, grown by the same inserts) %s\n",
			t.ids, r.bytesPerKey, t.bound, floor, t.floor, floorKeys, met(r.bytesPerKey <= t.bound))
	}
	// The claim-ratio targets hold for a server capped at 1/8 of the table
	// or less: above that the table's pages fit, and the verdict is n/a.
	capped := func(r *result, ok bool) (string, string) {
		if r.memBytes == 0 {
			return "cap unknown", "n/a"
		}
		if r.memBytes*8 > r.tableBytes {
			return fmt.Sprintf("cap %.2f of the table, above the 1/8 the target asks", float64(r.memBytes)/float64(r.tableBytes)), "n/a"
		}
		return fmt.Sprintf("cap 1/%.0f of the table", float64(r.tableBytes)/float64(r.memBytes)), met(ok)
	}
	if r := res["partitioned/v7"]; r != nil {
		c, verdict := capped(r, r.ratio >= 0.95)
		fmt.Printf("bench-keys: target claim_ratio ids=v7 measured=%.2f target=>=0.95 floor=1.00 (no loss; %s) %s\n", r.ratio, c, verdict)
	}
	if r, s := res["partitioned/v4"], res["single-table/v4"]; r != nil && s != nil {
		c, verdict := capped(r, r.ratio >= s.ratio)
		fmt.Printf("bench-keys: target claim_ratio ids=v4 measured=%.2f target=>=%.2f (single-table's in this run) floor=1.00 (no loss; %s) %s\n",
			r.ratio, s.ratio, c, verdict)
	}
	if r := res["partitioned/v7"]; r != nil && r.retired {
		fmt.Printf("bench-keys: target retire_day ids=v7 measured=%v dead_tuples=%d target=<1s,0 floor=0s,0 %s\n",
			r.cleanup.Round(time.Millisecond), r.deadLeft, met(r.cleanup < time.Second && r.deadLeft <= 0))
		fmt.Printf("bench-keys: target maintenance_wait ids=v7 measured=%v target=<=50ms floor=%v (the longest claim just before the maintenance) %s\n",
			r.waitMax.Round(100*time.Microsecond), r.baseMax.Round(100*time.Microsecond), met(r.waitMax <= 50*time.Millisecond))
	}
	return nil
}

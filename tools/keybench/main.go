// Command keybench measures what a key table's size costs a claim: it fills
// a big key table (default 10M keys) and a small one (100k) in the same
// Postgres, whose memory should be capped well below the big table
// (scripts/bench-keys.sh runs it in a memory cgroup), then alternates claim
// runs of new keys against each through pgstore.Store.Do and prints one
// line per case:
//
//	bench-keys: layout=single-table|partitioned ids=v4|v7 keys=N mem=M small_tps=X big_tps=Y ratio=R bytes_per_key=B
//
// and the cost of retiring the oldest day of keys (DELETE and VACUUM, or
// dropping a partition) while claims go on, with the claims' waits. It
// ends with one line per target of the partitioned layout, each with the
// floor it is set against, measured in the same run (a table of the least
// row a key can have, grown by the same inserts):
//
//	bench-keys: target <what> ids=v4|v7 measured=X target=<bound> floor=F met|missed
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("DATABASE_URL"), "Postgres to measure")
	keys := flag.Int("keys", 10_000_000, "keys in the big table")
	small := flag.Int("small", 100_000, "keys in the small table")
	clients := flag.Int("clients", 4, "concurrent claimers")
	dur := flag.Duration("dur", 20*time.Second, "length of one claim run")
	rounds := flag.Int("rounds", 3, "small/big run pairs per case")
	mem := flag.String("mem", "?", "the server's memory cap, as printed")
	cases := flag.String("cases", "single-table/v4,single-table/v7,partitioned/v4,partitioned/v7", "layout/ids cases to run")
	floorKeys := flag.Int("floor-keys", 1_000_000, "keys in each table of the least row (the bytes-per-key floors)")
	retire := flag.Bool("retire", true, "measure retiring the oldest day of keys")
	limit := flag.String("cgroup-limit", "", "the server's cgroup memory limit file: the tables are filled under -fill-mem, the claims run under -mem")
	fillMem := flag.String("fill-mem", "4G", "the server's memory while the tables are filled (with -cgroup-limit)")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	res := map[string]*result{}
	for _, c := range strings.Split(*cases, ",") {
		layout, ids, _ := strings.Cut(c, "/")
		switch layout {
		case "legacy": // the names of earlier runs
			layout = "single-table"
		case "new":
			layout = "partitioned"
		case "single-table", "partitioned":
		default:
			log.Fatalf("case %q: the layout is single-table or partitioned", c)
		}
		if ids != "v4" && ids != "v7" {
			log.Fatalf("case %q: the ids are v4 or v7", c)
		}
		b := &bench{pool: pool, layout: layout, ids: ids, clients: *clients, dur: *dur, limit: *limit, fillMem: *fillMem, mem: *mem}
		r, err := b.run(ctx, *keys, *small, *rounds, *mem, *retire)
		if err != nil {
			log.Fatalf("%s: %v", c, err)
		}
		res[layout+"/"+ids] = r
	}
	// The floors are measured with memory to spare, as the tables were filled.
	if *limit != "" {
		b := &bench{limit: *limit}
		if err := b.capMemory(*fillMem); err != nil {
			log.Fatal(err)
		}
	}
	if err := targets(ctx, pool, res, *floorKeys); err != nil {
		log.Fatal(err)
	}
}

// result is what a case measured, for the target lines.
type result struct {
	ratio, bytesPerKey float64
	tableBytes         int64
	memBytes           int64 // the server's cap, 0 if unknown
	retired            bool
	cleanup            time.Duration
	deadLeft           int64 // dead tuples Cleanup added
	waitMax, waitP99   time.Duration
	baseMax, baseP99   time.Duration
}

type bench struct {
	pool        *pgxpool.Pool
	layout, ids string
	clients     int
	dur         time.Duration
	// limit is the cgroup file that caps the server's memory: fillMem
	// while filling, mem while claiming.
	limit, fillMem, mem string
}

// capMemory sets the server's memory cap, when the bench controls it.
func (b *bench) capMemory(v string) error {
	if b.limit == "" {
		return nil
	}
	// The kernel reclaims the cache down to a lower limit, or refuses
	// (EBUSY) for a while: retry.
	var err error
	for try := 0; try < 50; try++ {
		if err = os.WriteFile(b.limit, []byte(v), 0o644); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("cap the server's memory at %s: %w", v, err)
}

func (b *bench) logf(format string, args ...any) {
	log.Printf("%s/%s: "+format, append([]any{b.layout, b.ids}, args...)...)
}

func (b *bench) run(ctx context.Context, keys, small, rounds int, mem string, retire bool) (*result, error) {
	// Filling under the cap would take hours of random reads: the tables
	// are grown by the same inserts with memory to spare, then the cap
	// drops the cache before the claims run.
	if err := b.capMemory(b.fillMem); err != nil {
		return nil, err
	}
	bigStore, err := b.prepare(ctx, "big", keys)
	if err != nil {
		return nil, err
	}
	res := &result{memBytes: parseBytes(mem)}
	smallStore, err := b.prepare(ctx, "small", small)
	if err != nil {
		return nil, err
	}
	bytes, err := b.tableBytes(ctx, bigStore)
	if err != nil {
		return nil, err
	}
	if err := b.capMemory(b.mem); err != nil {
		return nil, err
	}
	var smallTPS, bigTPS float64
	for r := 0; r < rounds; r++ {
		s := b.claims(ctx, smallStore)
		g := b.claims(ctx, bigStore)
		b.logf("round %d: small %.0f tps, big %.0f tps", r+1, s, g)
		smallTPS, bigTPS = smallTPS+s/float64(rounds), bigTPS+g/float64(rounds)
	}
	res.ratio, res.bytesPerKey, res.tableBytes = bigTPS/smallTPS, float64(bytes)/float64(keys), bytes
	fmt.Printf("bench-keys: layout=%s ids=%s keys=%d mem=%s small_tps=%.0f big_tps=%.0f ratio=%.2f bytes_per_key=%.0f\n",
		b.layout, b.ids, keys, mem, smallTPS, bigTPS, res.ratio, res.bytesPerKey)
	if retire {
		if err := b.retire(ctx, bigStore, keys, res); err != nil {
			return nil, err
		}
	}
	for _, s := range []*pgstore.Store{smallStore, bigStore} {
		if _, err := b.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.Config().Schema}.Sanitize()+" CASCADE"); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// The stored keys were claimed over the 7 days that ended at midnight (UTC)
// yesterday, so the oldest day of them (a whole day partition in the new
// layout) is past the 7-day TTL.
const span = 7 * 24 * time.Hour

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

// claims runs claimers of new keys on s for b.dur and returns claims/s.
func (b *bench) claims(ctx context.Context, s *pgstore.Store) float64 {
	ctx, cancel := context.WithTimeout(ctx, b.dur)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < b.clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fp := dedupe.FingerprintOf([]byte("payload"))
			for ctx.Err() == nil {
				req := dedupe.Request{Key: dedupe.Key{Scope: "bench", ID: b.newID()}, Fingerprint: fp,
					Source: dedupe.Source{Topic: "bench-topic", Partition: 3, Offset: n.Load()}}
				if _, err := s.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err == nil {
					n.Add(1)
				} else if ctx.Err() == nil {
					log.Fatalf("claim: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// retire measures retiring the oldest day of keys: Cleanup, then (for
// deleted rows) a VACUUM, and the dead tuples left. Claimers of new keys run
// on the store from a while before the Cleanup to its end, so the claims'
// waits during the maintenance compare with theirs just before it.
func (b *bench) retire(ctx context.Context, s *pgstore.Store, keys int, res *result) error {
	// The claims runs leave dead tuples of their own: the claims in flight
	// when a run ends are cancelled and their rows rolled back.
	deadBefore, err := b.deadTuples(ctx, s)
	if err != nil {
		return err
	}
	lc := b.timedClaims(ctx, s)
	time.Sleep(baseline)
	start := time.Now()
	n, err := s.Cleanup(ctx, &dedupe.CleanupConfig{BatchSize: 10_000})
	cleanupEnd := time.Now()
	claims := lc.stop()
	if err != nil {
		return err
	}
	cleanup := cleanupEnd.Sub(start)
	// The claimers stopped between claims: they rolled nothing back.
	deadAfterCleanup, err := b.deadTuples(ctx, s)
	if err != nil {
		return err
	}
	var during, before []time.Duration
	for _, c := range claims {
		switch {
		case c.start.Before(cleanupEnd) && c.end.After(start):
			during = append(during, c.end.Sub(c.start))
		case c.end.Before(start) && c.start.After(start.Add(-baseline/2)):
			// The second half of the time before, when every claimer was running.
			before = append(before, c.end.Sub(c.start))
		}
	}
	res.waitMax, res.waitP99 = maxP99(during)
	res.baseMax, res.baseP99 = maxP99(before)
	start = time.Now()
	if _, err := b.pool.Exec(ctx, "VACUUM "+tbl(s)); err != nil {
		return err
	}
	vacuum := time.Since(start)
	if _, err := b.pool.Exec(ctx, "ANALYZE "+tbl(s)); err != nil {
		return err
	}
	res.retired, res.cleanup, res.deadLeft = n > 0, cleanup, deadAfterCleanup-deadBefore
	fmt.Printf("bench-keys: retire layout=%s ids=%s keys=%d retired=%d cleanup=%v dead_tuples_before=%d dead_tuples_left=%d vacuum=%v\n",
		b.layout, b.ids, keys, n, cleanup.Round(time.Millisecond), deadBefore, deadAfterCleanup, vacuum.Round(time.Millisecond))
	fmt.Printf("bench-keys: claims during the retire layout=%s ids=%s claims=%d wait_p99=%v wait_max=%v; just before it claims=%d wait_p99=%v wait_max=%v\n",
		b.layout, b.ids, len(during), res.waitP99.Round(100*time.Microsecond), res.waitMax.Round(100*time.Microsecond),
		len(before), res.baseP99.Round(100*time.Microsecond), res.baseMax.Round(100*time.Microsecond))
	return nil
}

// baseline is how long claimers run before the Cleanup starts.
const baseline = 6 * time.Second

type timedClaim struct{ start, end time.Time }

type claimLoad struct {
	stopping atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex
	claims   []timedClaim
}

// timedClaims starts b.clients claimers of new keys on s, each timing its
// claims, until stop.
func (b *bench) timedClaims(ctx context.Context, s *pgstore.Store) *claimLoad {
	l := &claimLoad{}
	fp := dedupe.FingerprintOf([]byte("payload"))
	for c := 0; c < b.clients; c++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stopping.Load(); i++ {
				req := dedupe.Request{Key: dedupe.Key{Scope: "bench", ID: b.newID()}, Fingerprint: fp,
					Source: dedupe.Source{Topic: "bench-topic", Partition: 3, Offset: int64(i)}}
				t := time.Now()
				if _, err := s.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
					log.Fatalf("claim during the retire: %v", err)
				}
				l.mu.Lock()
				l.claims = append(l.claims, timedClaim{t, time.Now()})
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *claimLoad) stop() []timedClaim {
	l.stopping.Store(true)
	l.wg.Wait()
	return l.claims
}

func maxP99(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)-1], d[len(d)*99/100]
}

// deadTuples counts the dead tuples in the store's tables, with
// pgstattuple's exact scan when the extension is there, else from the
// statistics collector.
func (b *bench) deadTuples(ctx context.Context, s *pgstore.Store) (int64, error) {
	var dead int64
	err := b.pool.QueryRow(ctx, `SELECT COALESCE(sum((pgstattuple(r)).dead_tuple_count), 0)::int8
FROM (SELECT relid AS r FROM pg_partition_tree($1::regclass) WHERE isleaf
      UNION ALL SELECT $1::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree($1::regclass))) t`, tbl(s)).Scan(&dead)
	if err == nil {
		return dead, nil
	}
	err = b.pool.QueryRow(ctx, `SELECT pg_stat_force_next_flush() IS NULL`).Scan(new(bool))
	_ = err
	err = b.pool.QueryRow(ctx, `SELECT COALESCE(sum(n_dead_tup), 0)::int8 FROM pg_stat_user_tables WHERE schemaname = $1`,
		s.Config().Schema).Scan(&dead)
	return dead, err
}

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

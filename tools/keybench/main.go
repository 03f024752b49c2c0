// Command keybench measures what a key table's size costs a claim: it fills
// a big key table (default 10M keys) and a small one (100k) in the same
// Postgres, whose memory should be capped well below the big table
// (scripts/bench-keys.sh runs it in a memory cgroup), then alternates claim
// runs of new keys against each through pgstore.Store.Do and prints one
// line per case:
//
//	bench-keys: layout=legacy|new ids=v4|v7 keys=N mem=M small_tps=X big_tps=Y ratio=R bytes_per_key=B
//
// and the cost of retiring the oldest day of keys (DELETE and VACUUM, or
// dropping a partition).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
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
	cases := flag.String("cases", "legacy/v4,legacy/v7,new/v4,new/v7", "layout/ids cases to run")
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
	for _, c := range strings.Split(*cases, ",") {
		layout, ids, _ := strings.Cut(c, "/")
		b := &bench{pool: pool, layout: layout, ids: ids, clients: *clients, dur: *dur, limit: *limit, fillMem: *fillMem, mem: *mem}
		if err := b.run(ctx, *keys, *small, *rounds, *mem, *retire); err != nil {
			log.Fatalf("%s: %v", c, err)
		}
	}
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

func (b *bench) run(ctx context.Context, keys, small, rounds int, mem string, retire bool) error {
	// Filling under the cap would take hours of random reads: the tables
	// are grown by the same inserts with memory to spare, then the cap
	// drops the cache before the claims run.
	if err := b.capMemory(b.fillMem); err != nil {
		return err
	}
	bigStore, err := b.prepare(ctx, "big", keys)
	if err != nil {
		return err
	}
	smallStore, err := b.prepare(ctx, "small", small)
	if err != nil {
		return err
	}
	bytes, err := b.tableBytes(ctx, bigStore)
	if err != nil {
		return err
	}
	if err := b.capMemory(b.mem); err != nil {
		return err
	}
	var smallTPS, bigTPS float64
	for r := 0; r < rounds; r++ {
		s := b.claims(ctx, smallStore)
		g := b.claims(ctx, bigStore)
		b.logf("round %d: small %.0f tps, big %.0f tps", r+1, s, g)
		smallTPS, bigTPS = smallTPS+s/float64(rounds), bigTPS+g/float64(rounds)
	}
	fmt.Printf("bench-keys: layout=%s ids=%s keys=%d mem=%s small_tps=%.0f big_tps=%.0f ratio=%.2f bytes_per_key=%.0f\n",
		b.layout, b.ids, keys, mem, smallTPS, bigTPS, bigTPS/smallTPS, float64(bytes)/float64(keys))
	if retire {
		if err := b.retire(ctx, bigStore, keys); err != nil {
			return err
		}
	}
	for _, s := range []*pgstore.Store{smallStore, bigStore} {
		if _, err := b.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s.Config().Schema}.Sanitize()+" CASCADE"); err != nil {
			return err
		}
	}
	return nil
}

// The stored keys were claimed over the 7 days that ended at midnight (UTC)
// yesterday, so the oldest day of them (a whole day partition in the new
// layout) is past the 7-day TTL.
const span = 7 * 24 * time.Hour

func (b *bench) prepare(ctx context.Context, name string, n int) (*pgstore.Store, error) {
	schema := fmt.Sprintf("keybench_%s_%s_%s", b.layout, b.ids, name)
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
	if b.layout == "new" {
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
	if b.layout == "new" {
		return pgstore.New(b.pool, &pgstore.Config{Schema: schema, Layout: pgstore.LayoutPartitioned})
	}
	return pgstore.New(b.pool, &pgstore.Config{Schema: schema})
}

// fill inserts n keys in claim order, a million per statement, as claims
// would have grown the table: random IDs land anywhere in the index,
// time-ordered ones at its end.
func (b *bench) fill(ctx context.Context, s *pgstore.Store, n int) error {
	const chunk = 1_000_000
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		stmt := b.fillSQL(s)
		if b.layout == "new" {
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
// deleted rows) a VACUUM, and the dead tuples left.
func (b *bench) retire(ctx context.Context, s *pgstore.Store, keys int) error {
	// The claims runs leave dead tuples of their own: the claims in flight
	// when a run ends are cancelled and their rows rolled back.
	deadBefore, err := b.deadTuples(ctx, s)
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := s.Cleanup(ctx, &dedupe.CleanupConfig{BatchSize: 10_000})
	if err != nil {
		return err
	}
	cleanup := time.Since(start)
	deadAfterCleanup, err := b.deadTuples(ctx, s)
	if err != nil {
		return err
	}
	start = time.Now()
	if _, err := b.pool.Exec(ctx, "VACUUM "+tbl(s)); err != nil {
		return err
	}
	vacuum := time.Since(start)
	if _, err := b.pool.Exec(ctx, "ANALYZE "+tbl(s)); err != nil {
		return err
	}
	fmt.Printf("bench-keys: retire layout=%s ids=%s keys=%d retired=%d cleanup=%v dead_tuples_before=%d dead_tuples_left=%d vacuum=%v\n",
		b.layout, b.ids, keys, n, cleanup.Round(time.Millisecond), deadBefore, deadAfterCleanup, vacuum.Round(time.Millisecond))
	return nil
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

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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

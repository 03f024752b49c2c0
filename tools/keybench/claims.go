package main

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

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

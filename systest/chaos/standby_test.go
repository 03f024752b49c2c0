package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/systest/pgcluster"
)

// The pg-failover fault: the topology run's Postgres is a primary with a
// synchronous standby (pg_basebackup, streaming, synchronous_standby_names
// = '*'), and the workers, their outbox relays and the suite reach it
// through a connection string naming both servers with
// target_session_attrs=read-write, so a new connection goes to whichever
// accepts writes. The fault kills the primary with SIGKILL (the postmaster
// and every backend), promotes the standby, and builds a new standby from
// the promoted server in the old one's place, so the next failover finds a
// pair again. The commits the killed primary had acknowledged are on the
// standby (synchronous replication); a commit it had not acknowledged may
// or may not be, and the worker, which saw its connection fail, applies
// that command again (or finds it applied) on the new primary. As with
// synchronous_standby_names in its strict form, the promoted server
// acknowledges no commit until the new standby streams: the recovery counts
// the rebuild.

// pgPair is a primary and its synchronous standby, two clusters of the
// suite's own on ports of their own.
type pgPair struct {
	mu      sync.Mutex
	nodes   [2]*pgcluster.Cluster
	primary int // the index of the primary in nodes
}

// newPGPair makes prim (newPGCluster's) a primary with a synchronous
// standby of it under base.
func newPGPair(t testing.TB, prim *pgcluster.Cluster, base string) *pgPair {
	t.Helper()
	p := &pgPair{}
	// A standby copies this file: the setting is the promoted server's too.
	if err := prim.Configure("synchronous_standby_names = '*'\nwal_keep_size = '256MB'\nhot_standby = on\n"); err != nil {
		t.Fatal(err)
	}
	sb := pgcluster.New(t, prim.Bin, base, "pgdata-standby")
	p.nodes = [2]*pgcluster.Cluster{prim, sb}
	if err := p.buildStandby(1); err != nil {
		t.Fatal(err)
	}
	if err := prim.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := p.waitSync(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	return p
}

// DSN is the connection string of the pair: both servers, the one that
// accepts writes.
func (p *pgPair) DSN() string {
	return p.dsn("read-write")
}

func (p *pgPair) dsn(attrs string) string {
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", p.nodes[0].Port, p.nodes[1].Port)
	if attrs != "" {
		u += "&target_session_attrs=" + attrs
	}
	return u
}

// primaryURL is the current primary's own URL.
func (p *pgPair) primaryURL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[p.primary].URL()
}

// buildStandby makes nodes[i] a new standby of the primary: its data
// directory replaced by a base backup (WAL streamed alongside, a fast
// checkpoint), its own port, started.
func (p *pgPair) buildStandby(i int) error {
	prim, sb := p.nodes[p.primary], p.nodes[i]
	if err := prim.Backup(sb, true); err != nil {
		return err
	}
	if err := sb.Start(); err != nil {
		return fmt.Errorf("%w\n%s", err, lastLines(filepath.Join(sb.Dir, "server.log"), 5))
	}
	return nil
}

// waitSync waits until the primary has a synchronous standby streaming.
func (p *pgPair) waitSync(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	url := p.primaryURL()
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(qctx, url)
		if err == nil {
			var n int
			err = conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'`).Scan(&n)
			_ = conn.Close(qctx)
			if err == nil && n == 0 {
				err = fmt.Errorf("no synchronous standby streaming")
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond) // poll: the standby is connecting
	}
	return fmt.Errorf("chaos: the primary (%s) has no synchronous standby within %v: %v", url, d, last)
}

// failover kills the primary, promotes the standby and, once it accepts
// writes, calls promoted; then it rebuilds a standby from the new primary
// in the old one's place and waits until it streams synchronously.
func (p *pgPair) failover(ctx context.Context, promoted func()) error {
	p.mu.Lock()
	old, nw := p.primary, 1-p.primary
	p.mu.Unlock()
	if err := p.nodes[old].Kill9(); err != nil {
		return err
	}
	if err := p.nodes[nw].Promote(); err != nil {
		return err
	}
	p.mu.Lock()
	p.primary = nw
	p.mu.Unlock()
	if promoted != nil {
		promoted()
	}
	if err := p.buildStandby(old); err != nil {
		return err
	}
	return p.waitSync(ctx, 3*time.Minute)
}

// pgFailover injects one pg-failover fault: a batch of commands right
// before it, so partitions have work; the recovery is the time from the
// kill until every partition that had work then is committed past where
// it was.
func (r *topoRun) pgFailover(ctx context.Context, c *chaosRun) {
	const kind = "pg-failover"
	start := time.Now()
	if r.pg == nil {
		c.t.Errorf("chaos: %s without a Postgres pair", kind)
		return
	}
	if err := r.waitReplicated(ctx, 3*time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	if err := r.pg.waitSync(ctx, time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	if _, ok := r.workBatch(ctx, c, "before "+kind); !ok {
		return
	}
	c.ws.mu.Lock()
	exitsBefore := len(c.ws.exits)
	c.ws.mu.Unlock()
	work := c.mon.lagging(ctx)
	at := time.Now()
	// The offsets are taken again once the standby is promoted: until then
	// the group may still commit records whose transactions had committed
	// on the killed primary, which says nothing of the new one.
	var promotedAt time.Time
	var base map[int]int64
	promoted := make(chan struct{})
	done := make(chan error, 1)
	var syncedAt time.Time
	go func() {
		err := r.pg.failover(ctx, func() {
			promotedAt = time.Now()
			base = map[int]int64{}
			for p, off := range c.mon.lagging(ctx) {
				if _, ok := work[p]; ok {
					base[p] = off
				}
			}
			close(promoted)
		})
		syncedAt = time.Now()
		done <- err
	}()
	select {
	case <-promoted:
	case err := <-done: // failed before the promotion
		done <- err
	}
	d, ok := time.Duration(0), true
	if len(base) > 0 {
		d, ok = c.mon.progressed(ctx, base, at, 3*time.Minute)
		if ok {
			r.recovered[kind] = append(r.recovered[kind], d)
		} else {
			r.unrecov[kind]++
		}
	}
	ferr := <-done
	if ferr != nil {
		c.t.Errorf("chaos: %s: %v", kind, ferr)
	}
	took := syncedAt.Sub(at)
	// The sessions the workers opened while the old primary was down all
	// went to the promoted server. They are ended once its replacement
	// streams, as a pool's idle timeout or a proxy would end them: the
	// next connections choose between two running servers, one of which
	// accepts writes. A batch follows, and the group must consume it.
	reconn := ""
	if ferr == nil {
		ended, err := r.pg.endSessions(ctx)
		if err != nil {
			c.t.Errorf("chaos: %s: end the sessions on the new primary: %v", kind, err)
		}
		_, _ = r.workBatch(ctx, c, "after "+kind) // an error is reported; the check below goes on
		from := time.Now()
		if again := c.mon.lagging(ctx); len(again) > 0 {
			d2, ok2 := c.mon.progressed(ctx, again, from, 2*time.Minute)
			if ok2 {
				reconn = fmt.Sprintf(", %d sessions ended and consuming again after %s", ended, d2.Round(100*time.Millisecond))
			} else {
				reconn = fmt.Sprintf(", %d sessions ended and NOT consuming again within 2m", ended)
				c.t.Errorf("chaos: %s: the workers did not consume again within 2m once their sessions on the new primary were ended (lagging %v): a new connection must reach the server that accepts writes", kind, again)
			}
		}
	}
	c.ws.mu.Lock()
	exits := slices.Clone(c.ws.exits[exitsBefore:])
	c.ws.mu.Unlock()
	for _, e := range exits {
		c.mu.Lock()
		c.startupProblems = append(c.startupProblems, fmt.Sprintf("during %s: %s (a worker must reconnect to the new primary without a restart)", kind, e))
		c.mu.Unlock()
	}
	c.n.pgRestarts.Add(1)
	r.done[kind]++
	rec := "no partition had work"
	switch {
	case len(base) > 0 && ok:
		rec = "consuming again after " + d.Round(100*time.Millisecond).String()
	case len(base) > 0:
		rec = "NOT consuming again within 3m"
	}
	promo := "not promoted"
	if !promotedAt.IsZero() {
		promo = "promoted after " + promotedAt.Sub(at).Round(100*time.Millisecond).String()
	}
	line := fmt.Sprintf("%s #%d (%d partitions with work, %d still at the promotion): %s, %s, new standby streaming after %s%s, %d worker exits, fault took %s", kind, r.done[kind], len(work), len(base), promo, rec,
		took.Round(100*time.Millisecond), reconn, len(exits), time.Since(start).Round(100*time.Millisecond))
	r.timeline = append(r.timeline, line)
	c.t.Logf("chaos-topology: %s", line)
}

// endSessions ends every client session on the primary but its own, and
// returns how many.
func (p *pgPair) endSessions(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.primaryURL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n)
	return n, err
}

// usesPair reports whether the topology run needs the Postgres pair: only
// with pg-failover among its kinds, so the Kafka kinds alone run on one
// server.
func (tp *topology) usesPair() bool {
	return tp != nil && slices.Contains(tp.kinds, "pg-failover")
}

// TestPGPairFailover checks the pair on its own: a row written on the
// primary is on the promoted standby, and a connection through the pair's
// connection string writes on the new primary, twice over (the rebuilt
// standby is promotable in turn).
func TestPGPairFailover(t *testing.T) {
	if testing.Short() || !envBool("CHAOS_TOPOLOGY", false) {
		t.Skip("chaos: the Postgres pair's failover runs with CHAOS_TOPOLOGY=1")
	}
	requireTools(t)
	base, err := os.MkdirTemp("", "exactly-pgpair-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	p := newPGPair(t, newPGCluster(t, base), base)
	ctx := context.Background()
	write := func(step string) {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(p.DSN())
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var err2 error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err2 = pool.Exec(wctx, `CREATE TABLE IF NOT EXISTS pair_check (step text PRIMARY KEY)`)
			if err2 == nil {
				_, err2 = pool.Exec(wctx, `INSERT INTO pair_check VALUES ($1)`, step)
			}
			cancel()
			if err2 == nil {
				return
			}
			time.Sleep(200 * time.Millisecond) // poll: connections to the killed server fail until it is gone
		}
		t.Fatalf("write %q through %s: %v", step, p.DSN(), err2)
	}
	rows := func() []string {
		t.Helper()
		conn, err := pgx.Connect(ctx, p.primaryURL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var out []string
		r, err := conn.Query(ctx, `SELECT step FROM pair_check ORDER BY step`)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var s string
			if err := r.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	write("a-before")
	for i, step := range []string{"b-after-first", "c-after-second"} {
		if err := p.failover(ctx, nil); err != nil {
			t.Fatalf("failover %d: %v", i+1, err)
		}
		write(step)
	}
	if got, want := rows(), []string{"a-before", "b-after-first", "c-after-second"}; !slices.Equal(got, want) {
		t.Fatalf("rows on the primary after two failovers: %v, want %v", got, want)
	}
}

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/systest/pgcluster"
)

// chaosRun injects the faults of one run.
type chaosRun struct {
	t    *testing.T
	o    options
	sc   scale
	ws   *workers
	pg   *pgcluster.Cluster
	br   *broker
	pool *pgxpool.Pool
	n    *counts
	mon  *monitor
	rnd  *rand.Rand
	bg   sync.WaitGroup

	mu              sync.Mutex
	startupProblems []string

	timeline []string // the faults other than kills and how long each took

	lastKill time.Time
	lastBase map[int]int64

	topo *topoRun // the broker cluster's faults, in a topology run
}

// runPlan runs every fault of the plan in a seeded random order, a short
// random gap apart; a SIGSTOPped worker stays stopped in the background
// while the next faults run.
func (c *chaosRun) runPlan(ctx context.Context) {
	var plan []string
	add := func(n int, f string) {
		for i := 0; i < n; i++ {
			plan = append(plan, f)
		}
	}
	add(c.sc.kills, "kill")
	add(c.sc.pgRestarts, "pg-restart")
	add(c.sc.brokerCrashes, "broker-crash")
	add(c.sc.workerStops, "worker-stop")
	add(c.sc.pgPauses, "pg-pause")
	add(c.sc.brokerPauses, "broker-pause")
	if c.topo == nil && !c.o.keyMaintenance {
		add(c.sc.restores, "pg-restore")
	}
	if c.topo != nil {
		for _, k := range c.topo.cfg.kinds {
			add(c.topo.cfg.each, k)
		}
	}
	c.rnd.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	for _, f := range plan {
		if ctx.Err() != nil {
			break
		}
		gap := c.sc.gapMin + time.Duration(c.rnd.Int64N(int64(c.sc.gapMax-c.sc.gapMin)))
		time.Sleep(gap) // the schedule: faults are spaced out on purpose
		start := time.Now()
		switch f {
		case "kill":
			c.kill(ctx)
		case "pg-restart":
			if err := c.pg.RestartImmediate(); err != nil {
				c.t.Error(err)
			}
			c.n.pgRestarts.Add(1)
		case "broker-crash":
			c.brokerCrash()
		case "worker-stop":
			c.workerStop()
		case "pg-restore":
			c.restore(ctx)
		case "pg-pause":
			c.pg.Pause(time.Duration(1000+c.rnd.IntN(1500)) * time.Millisecond)
			c.n.pauses.Add(1)
		case "broker-pause":
			c.br.pause(time.Duration(1000+c.rnd.IntN(1500)) * time.Millisecond)
			c.n.pauses.Add(1)
		default:
			c.topo.fault(ctx, c, f)
		}
		if f != "kill" {
			c.timeline = append(c.timeline, fmt.Sprintf("%s %s", f, time.Since(start).Round(100*time.Millisecond)))
		}
	}
	c.bg.Wait()
}

// targets are the workers that may be killed or stopped: running, not
// stopped.
func (c *chaosRun) targets() []*worker {
	c.ws.mu.Lock()
	defer c.ws.mu.Unlock()
	var out []*worker
	for _, w := range c.ws.all {
		w.mu.Lock()
		stopped := w.stopped
		w.mu.Unlock()
		if !stopped && w.alive() {
			out = append(out, w)
		}
	}
	return out
}

// kill kills a worker with SIGKILL, preferring one that Postgres shows in
// the middle of a command's transaction at that moment (which also means it
// owns a partition), and starts it again a little later. It reports whether
// the victim was mid-transaction.
func (c *chaosRun) kill(ctx context.Context) bool {
	ts := c.targets()
	if len(ts) == 0 {
		return false
	}
	victim := ts[c.rnd.IntN(len(ts))]
	midTx := false
	for deadline := time.Now().Add(time.Second); !midTx && time.Now().Before(deadline); {
		ports := c.txPorts(ctx)
		for _, w := range ts {
			for p := range tcpPorts(w.pid()) {
				if ports[p] {
					victim, midTx = w, true
				}
			}
		}
		if !midTx {
			time.Sleep(20 * time.Millisecond) // look again: transactions are short
		}
	}
	at := time.Now()
	victim.kill()
	// The offsets committed once the victim is gone: its partitions move
	// past them only when another member has taken them over.
	c.lastKill, c.lastBase = at, c.mon.lagging(ctx)
	c.mon.crash(at, c.lastBase)
	c.n.kills.Add(1)
	if midTx {
		c.n.killsMidTx.Add(1)
	}
	c.ws.respawn(victim, time.Duration(300+c.rnd.IntN(1200))*time.Millisecond)
	return midTx
}

// txPorts are the client ports of the Postgres sessions in the middle of a
// command's transaction (not the outbox relay's).
func (c *chaosRun) txPorts(ctx context.Context) map[int]bool {
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	rows, err := c.pool.Query(ctx, `SELECT client_port FROM pg_stat_activity
WHERE xact_start IS NOT NULL AND client_port IS NOT NULL AND pid <> pg_backend_pid()
  AND query ~* '(exactly_keys|accounts|holds|rejections|INSERT INTO[^;]*exactly_outbox)'`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var p int
		if rows.Scan(&p) == nil {
			out[p] = true
		}
	}
	return out
}

// brokerCrash kills the broker with SIGKILL, starts a worker while it is
// down, and restarts the broker on its data.
func (c *chaosRun) brokerCrash() {
	if err := c.br.do("kill"); err != nil {
		c.t.Error(err)
		return
	}
	c.ws.mu.Lock()
	w := &worker{id: len(c.ws.all), extra: c.ws.modeArgs(len(c.ws.all))}
	c.ws.all = append(c.ws.all, w)
	err := c.ws.start(w)
	c.ws.mu.Unlock()
	if err != nil {
		c.t.Error(err)
	}
	time.Sleep(3 * time.Second) // the broker stays down this long
	if !w.alive() {
		w.mu.Lock()
		err := w.exitErr
		log := w.logs[len(w.logs)-1]
		w.mu.Unlock()
		if c.o.startupWait {
			c.mu.Lock()
			c.startupProblems = append(c.startupProblems, fmt.Sprintf("worker %d, started while the broker was down, exited (%v) instead of waiting for it: %s", w.id, err, lastLines(log, 2)))
			c.mu.Unlock()
		}
	}
	if err := c.br.do("restart"); err != nil {
		c.t.Error(err)
	}
	c.n.brokerRestarts.Add(1)
}

// workerStop SIGSTOPs a worker for longer than its session timeout, in the
// background, then resumes it: the group moves on without it and it comes
// back as a zombie member whose generation is over.
func (c *chaosRun) workerStop() {
	ts := c.targets()
	if len(ts) < 2 {
		return
	}
	w := ts[c.rnd.IntN(len(ts))]
	w.mu.Lock()
	w.stopped = true
	cmd := w.cmd
	w.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	c.n.workerStops.Add(1)
	c.n.pauses.Add(1)
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		time.Sleep(sessionTimeout + 3*time.Second) // the fault: stopped past the session timeout
		_ = cmd.Process.Signal(syscall.SIGCONT)
		w.mu.Lock()
		w.stopped = false
		w.mu.Unlock()
	}()
}

// monitor polls the group's committed offsets and the log end, for the
// drain and for the recovery time after each crash.
type monitor struct {
	brokers []string
	pool    *pgxpool.Pool
	kc      *kafka.Client
	parts   partCount // the commands topic's partition count once raised (repartition_test.go)

	mu        sync.Mutex
	committed map[int]int64
	ends      map[int]int64
	probes    []probe
	recovered []time.Duration
	unrecov   int
}

// probe waits for every partition that had work when a worker crashed to
// be committed past where it was.
type probe struct {
	at   time.Time
	base map[int]int64
}

func newMonitor(brokers []string, pool *pgxpool.Pool) *monitor {
	return &monitor{brokers: brokers, pool: pool, kc: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}}
}

func (m *monitor) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	com, err := kafkaadmin.Committed(ctx, m.kc, group, commandsTopic, m.commandParts())
	if err != nil {
		return
	}
	ends, err := kafkaadmin.EndOffsets(ctx, m.kc, commandsTopic, m.commandParts())
	if err != nil {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.committed, m.ends = com, ends
	keep := m.probes[:0]
	for _, p := range m.probes {
		done := true
		for part, off := range p.base {
			if com[part] <= off {
				done = false
			}
		}
		switch {
		case done:
			m.recovered = append(m.recovered, now.Sub(p.at))
		case now.Sub(p.at) > time.Minute:
			m.unrecov++
		default:
			keep = append(keep, p)
		}
	}
	m.probes = keep
}

func (m *monitor) run(ctx context.Context) {
	for ctx.Err() == nil {
		m.poll(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// crash records a worker crash at at, with the committed offsets of the
// partitions that had work left once it was gone.
func (m *monitor) crash(at time.Time, base map[int]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(base) > 0 {
		m.probes = append(m.probes, probe{at: at, base: base})
	}
}

// recoveries summarises the crash-to-consuming times measured.
func (m *monitor) recoveries() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.recovered) == 0 {
		return fmt.Sprintf("none measured (%d not within 1m)", m.unrecov)
	}
	ds := slices.Clone(m.recovered)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("median %s max %s over %d crashes (%d not within 1m)", ds[len(ds)/2].Round(100*time.Millisecond),
		ds[len(ds)-1].Round(100*time.Millisecond), len(ds), m.unrecov)
}

// waitDrained waits until the group's committed offsets reach the log end
// on every partition and the outbox has nothing pending.
func (m *monitor) waitDrained(ctx context.Context, d time.Duration) (map[int]int64, error) {
	deadline := time.Now().Add(d)
	for {
		m.poll(ctx)
		m.mu.Lock()
		lag := map[int]int64{}
		for p, end := range m.ends {
			if c := m.committed[p]; c < end {
				lag[p] = end - max(c, 0)
			}
		}
		have := len(m.ends) == m.commandParts()
		m.mu.Unlock()
		if have && len(lag) == 0 {
			var pending int
			err := m.pool.QueryRow(ctx, `SELECT count(*) FROM ledger.exactly_outbox WHERE status = 'PENDING'`).Scan(&pending)
			if err == nil && pending == 0 {
				return nil, nil
			}
		}
		if time.Now().After(deadline) {
			return lag, fmt.Errorf("the group did not catch up, or the outbox did not empty, within %v", d)
		}
		select {
		case <-ctx.Done():
			return lag, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lagging polls now and returns the committed offset of every partition
// that has records left to consume.
func (m *monitor) lagging(ctx context.Context) map[int]int64 {
	m.poll(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[int]int64{}
	for p, end := range m.ends {
		if c := m.committed[p]; c < end {
			out[p] = c
		}
	}
	return out
}

// progressed waits until every partition of base is committed past its
// offset there, and returns how long that took from since.
func (m *monitor) progressed(ctx context.Context, base map[int]int64, since time.Time, d time.Duration) (time.Duration, bool) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m.poll(ctx)
		m.mu.Lock()
		done := true
		for p, off := range base {
			if m.committed[p] <= off {
				done = false
			}
		}
		m.mu.Unlock()
		if done {
			return time.Since(since), true
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return 0, false
}

// measureRecovery kills one worker at a time with nothing else failing, and
// times each crash until the group consumes again: every partition that had
// records left at the crash is committed past where it was. Before each
// kill the group must be healthy (all workers up, every lagging partition
// progressing).
func (c *chaosRun) measureRecovery(ctx context.Context, k int) (times []time.Duration, skipped int) {
	for i := 0; i < k; i++ {
		c.ws.mu.Lock()
		total := len(c.ws.all)
		c.ws.mu.Unlock()
		healthy := false
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && !healthy; {
			if len(c.targets()) == total {
				base := c.mon.lagging(ctx)
				if len(base) == 0 {
					return times, skipped + k - i // nothing left to consume: nothing to measure
				}
				_, healthy = c.mon.progressed(ctx, base, time.Now(), 5*time.Second)
			} else {
				time.Sleep(100 * time.Millisecond) // poll: a worker is still starting
			}
		}
		if !healthy {
			skipped++
			continue
		}
		if !c.kill(ctx) {
			skipped++ // the victim may have owned no partition: not a measurement
			continue
		}
		if len(c.lastBase) == 0 {
			return times, skipped + k - i
		}
		d, ok := c.mon.progressed(ctx, c.lastBase, c.lastKill, 90*time.Second)
		if !ok {
			skipped++
			continue
		}
		times = append(times, d)
	}
	return times, skipped
}

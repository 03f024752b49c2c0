package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/systest/pgcluster"
)

// The topology run: the workers, the producers and the audit of TestChaos,
// on a cluster of three Kafka nodes (scripts/kafka.sh cluster) whose topics
// have replication factor 3 and min.insync.replicas=2, with the faults of a
// replicated deployment: the leader of partitions killed with SIGKILL, the
// active controller killed, a node paused past its broker session.

// topoFaultKinds are the cluster's fault kinds, in the order the summary
// names them.
var topoFaultKinds = append([]string{"leader-kill", "controller-kill", "broker-session-pause", "partitions-raised", "pg-failover"}, netFaultKinds...)

// topology selects a topology run.
type topology struct {
	nodes int
	each  int      // faults of every kind in one run
	kinds []string // the fault kinds of the run, topoFaultKinds unless CHAOS_TOPOLOGY_KINDS
}

// topoKinds parses CHAOS_TOPOLOGY_KINDS, a comma-separated list of fault
// kinds ("" for all of them).
func topoKinds(env string) ([]string, error) {
	if strings.TrimSpace(env) == "" {
		return slices.Clone(topoFaultKinds), nil
	}
	var out []string
	for _, k := range strings.Split(env, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(topoFaultKinds, k) {
			return nil, fmt.Errorf("CHAOS_TOPOLOGY_KINDS: unknown fault kind %q (the kinds: %s)", k, strings.Join(topoFaultKinds, ","))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func (tp *topology) repro(o options) string {
	env := fmt.Sprintf("CHAOS_SEED=%d CHAOS_TOPOLOGY=1", o.seed)
	if tp.each != 2 {
		env += fmt.Sprintf(" CHAOS_TOPOLOGY_FAULTS=%d", tp.each)
	}
	if len(tp.kinds) != len(topoFaultKinds) {
		env += " CHAOS_TOPOLOGY_KINDS=" + strings.Join(tp.kinds, ",")
	}
	if o.batch != 200 {
		env += fmt.Sprintf(" CHAOS_BATCH=%d", o.batch)
	}
	return env + o.keyEnv() + " go test -race -count=1 -timeout 60m -run 'TestChaosTopology$' -v ./systest/chaos/"
}

func TestChaosTopology(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: the chaos suite does not run under -short; make chaos-topology runs the topology run")
	}
	if !envBool("CHAOS_TOPOLOGY", false) {
		t.Skip("chaos: the topology run (three brokers) runs with CHAOS_TOPOLOGY=1: make chaos-topology")
	}
	o := loadOptions()
	o.txns, o.cross, o.startupWait = envBool("CHAOS_TRANSACTIONS", true), envBool("CHAOS_CROSS_PARTITION", true), true
	tp := &topology{nodes: 3, each: 2}
	if n, err := strconv.Atoi(os.Getenv("CHAOS_TOPOLOGY_FAULTS")); err == nil && n >= 0 {
		tp.each = n
	}
	kinds, err := topoKinds(os.Getenv("CHAOS_TOPOLOGY_KINDS"))
	if err != nil {
		t.Fatal(err)
	}
	tp.kinds = kinds
	// The short run's workload; worker kills between the cluster's faults,
	// and no fault of the single-broker run.
	sc := scaleOf(false)
	sc.kills, sc.pgRestarts, sc.brokerCrashes, sc.workerStops, sc.pgPauses, sc.brokerPauses = 4, 0, 0, 0, 0, 0
	sc.recoveryKills = 0
	sc.drain = 5 * time.Minute
	runChaos(t, o, sc, tp)
}

// kcluster is a Kafka cluster of the suite's own, run by scripts/kafka.sh
// cluster on ports of its own.
type kcluster struct {
	script string
	env    []string
	n      int
	ports  []int
	// With proxied: the ports the nodes advertise on their PROXIED
	// listener (where the proxies listen), and that listener's own.
	aports, qports []int
}

// startCluster starts n nodes; proxied gives each a PROXIED listener for a
// proxy in front of it (netfault_test.go).
func startCluster(root, base string, n int, proxied bool) (*kcluster, error) {
	c := &kcluster{script: filepath.Join(root, "scripts", "kafka.sh"), n: n}
	var ports, cports, aports, qports []string
	// FreePort's ports are free when it returns, not reserved: two of its
	// calls can give the same one, which a node refuses for two listeners.
	taken := map[int]bool{}
	for i := 0; i < n; i++ {
		var ps [4]int
		for j := range ps {
			for {
				p, err := pgcluster.FreePort()
				if err != nil {
					return nil, err
				}
				if !taken[p] {
					taken[p], ps[j] = true, p
					break
				}
			}
		}
		c.ports = append(c.ports, ps[0])
		ports, cports = append(ports, strconv.Itoa(ps[0])), append(cports, strconv.Itoa(ps[1]))
		if proxied {
			c.aports, c.qports = append(c.aports, ps[2]), append(c.qports, ps[3])
			aports, qports = append(aports, strconv.Itoa(ps[2])), append(qports, strconv.Itoa(ps[3]))
		}
	}
	c.env = append(os.Environ(), "KAFKA_CLUSTER_SIZE="+strconv.Itoa(n), "KAFKA_CLUSTER_PORTS="+strings.Join(ports, ","),
		"KAFKA_CLUSTER_CONTROLLER_PORTS="+strings.Join(cports, ","), "KAFKA_RUN_DIR="+filepath.Join(base, "kafka"),
		"KAFKA_HEAP=384m", "KAFKA_START_TIMEOUT=400",
		"KAFKA_PROPERTIES=offsets.topic.num.partitions=3\ntransaction.state.log.num.partitions=3")
	if proxied {
		c.env = append(c.env, "KAFKA_CLUSTER_ADVERTISED_PORTS="+strings.Join(aports, ","), "KAFKA_CLUSTER_PROXIED_PORTS="+strings.Join(qports, ","))
	}
	return c, c.do("start")
}

func (c *kcluster) addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return out
}

func (c *kcluster) out(args ...string) (string, error) {
	cmd := exec.Command(c.script, append([]string{"cluster"}, args...)...)
	cmd.Env = c.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("chaos: kafka.sh cluster %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func (c *kcluster) do(args ...string) error { _, err := c.out(args...); return err }

// ackSet holds the IDs of the records the producers had acknowledged.
type ackSet struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (a *ackSet) add(recs []*kgo.Record) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]bool{}
	}
	for _, r := range recs {
		a.ids[header(r.Headers, kafkapubsub.UUIDHeader)] = true
	}
}

// missing reports, as problems of f, the acknowledged records the log does
// not hold, and returns how many.
func (a *ackSet) missing(all []rec, f *findings) int {
	if a == nil {
		return 0
	}
	have := map[string]bool{}
	for _, r := range all {
		have[r.uuid] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for id := range a.ids {
		if !have[id] {
			n++
			f.fail("acked-lost", "record %s was acknowledged to its producer (acks=all) but is not in %s", id, commandsTopic)
		}
	}
	return n
}

// topoRun injects the cluster's faults and times the recoveries.
type topoRun struct {
	cfg     *topology
	cl      *kcluster
	pg      *pgPair     // the Postgres pair, with pg-failover among the kinds
	net     *netProxies // the workers' proxies, with a net-* kind
	kc      *kafka.Client
	brokers []string
	prodCl  *kgo.Client
	produce func(context.Context, *kgo.Client, []*kgo.Record) error
	rnd     *workloadRand

	recovered map[string][]time.Duration
	unrecov   map[string]int
	done      map[string]int
	timeline  []string
}

func newTopoRun(cfg *topology, cl *kcluster, brokers []string, prodCl *kgo.Client, produce func(context.Context, *kgo.Client, []*kgo.Record) error, rnd *workloadRand) *topoRun {
	return &topoRun{cfg: cfg, cl: cl, brokers: brokers, kc: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}, prodCl: prodCl, produce: produce, rnd: rnd,
		recovered: map[string][]time.Duration{}, unrecov: map[string]int{}, done: map[string]int{}}
}

// leaders returns, for every partition of topic, its leader's node id.
func (r *topoRun) leaders(ctx context.Context, topic string) (map[int]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := r.kc.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, tp := range md.Topics {
		for _, p := range tp.Partitions {
			out[p.ID] = p.Leader.ID
		}
	}
	return out, nil
}

// waitReplicated waits until every partition of the suite's topics and of
// the internal ones has all nodes in its ISR: a node killed next then
// leaves two replicas in sync, min.insync.replicas.
func (r *topoRun) waitReplicated(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var short []string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		short = nil
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		md, err := r.kc.Metadata(mctx, &kafka.MetadataRequest{Topics: []string{commandsTopic, eventsTopic, dlqTopic, "__consumer_offsets", "__transaction_state"}})
		cancel()
		if err == nil {
			for _, tp := range md.Topics {
				for _, p := range tp.Partitions {
					if len(p.Isr) < r.cl.n {
						short = append(short, fmt.Sprintf("%s/%d isr %d", tp.Name, p.ID, len(p.Isr)))
					}
				}
			}
			if len(short) == 0 {
				return nil
			}
		}
		time.Sleep(500 * time.Millisecond) // poll: the restarted node is catching up
	}
	return fmt.Errorf("chaos: partitions not back to %d in-sync replicas within %v: %v", r.cl.n, d, short)
}

// fault injects one cluster fault of kind: a batch of commands is written
// (acknowledged by two replicas at least) right before it, so partitions
// have work; the recovery is the time from the fault until every partition
// that had work at that moment is committed past where it was.
func (r *topoRun) fault(ctx context.Context, c *chaosRun, kind string) {
	switch kind {
	case "partitions-raised":
		r.raisePartitions(ctx, c) // repartition_test.go
		return
	case "pg-failover":
		r.pgFailover(ctx, c) // standby_test.go
		return
	case "net-latency", "net-reset-commit", "net-half-open":
		r.netFault(ctx, c, kind) // netfault_test.go
		return
	}
	start := time.Now()
	if err := r.waitReplicated(ctx, 3*time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	if _, ok := r.workBatch(ctx, c, "before "+kind); !ok {
		return
	}
	lead, err := r.leaders(ctx, commandsTopic)
	if err != nil {
		c.t.Errorf("chaos: metadata before %s: %v", kind, err)
		return
	}
	base := c.mon.lagging(ctx)
	var node int
	switch kind {
	case "controller-kill":
		out, err := r.cl.out("controller")
		if err == nil {
			node, err = strconv.Atoi(out)
		}
		if err != nil {
			c.t.Errorf("chaos: the active controller: %v", err)
			return
		}
	default:
		// The node leading the most partitions that have work (of all
		// partitions when none has), other than the active controller when
		// another node leads some: controller-kill is the other fault.
		ctrl := -1
		if out, err := r.cl.out("controller"); err == nil {
			ctrl, _ = strconv.Atoi(out)
		}
		byNode := map[int]int{}
		for p, l := range lead {
			if _, ok := base[p]; ok || len(base) == 0 {
				byNode[l]++
			}
		}
		if len(byNode) > 1 {
			delete(byNode, ctrl)
		}
		var nodes []int
		for n := range byNode {
			nodes = append(nodes, n)
		}
		sort.Slice(nodes, func(i, j int) bool {
			return byNode[nodes[i]] > byNode[nodes[j]] || byNode[nodes[i]] == byNode[nodes[j]] && nodes[i] < nodes[j]
		})
		if len(nodes) == 0 || nodes[0] < 1 {
			c.t.Errorf("chaos: no leader found for %s (%v)", kind, lead)
			return
		}
		node = nodes[0]
	}
	at := time.Now()
	var resumed chan struct{}
	switch kind {
	case "broker-session-pause":
		out, err := r.cl.out("pid", strconv.Itoa(node))
		pid, _ := strconv.Atoi(out)
		if err != nil || pid == 0 {
			c.t.Errorf("chaos: pid of node %d: %v", node, err)
			return
		}
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		// The fault: stopped past broker.session.timeout.ms (9 s), so the
		// controller fences it and moves its leaderships; the recovery is
		// timed meanwhile.
		resumed = make(chan struct{})
		go func() {
			defer close(resumed)
			time.Sleep(13 * time.Second)
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}()
	default:
		if err := r.cl.do("kill", strconv.Itoa(node)); err != nil {
			c.t.Error(err)
			return
		}
	}
	d, ok := time.Duration(0), true
	if len(base) > 0 {
		d, ok = c.mon.progressed(ctx, base, at, 2*time.Minute)
		if ok {
			r.recovered[kind] = append(r.recovered[kind], d)
		} else {
			r.unrecov[kind]++
			// Two nodes of three serve: leaders and the group coordinator
			// move within the broker session; a group that consumes
			// nothing for two minutes is stuck.
			c.t.Errorf("chaos: %s of node %d: the partitions with work were not consumed again within 2m (lagging %v)", kind, node, base)
		}
	}
	if resumed != nil {
		<-resumed
	}
	if kind != "broker-session-pause" {
		if err := r.cl.do("restart", strconv.Itoa(node)); err != nil {
			c.t.Error(err)
		}
		c.n.brokerRestarts.Add(1)
	} else {
		c.n.pauses.Add(1)
	}
	r.done[kind]++
	rec := "no partition had work"
	if len(base) > 0 && ok {
		rec = "consuming again after " + d.Round(100*time.Millisecond).String()
	} else if len(base) > 0 {
		rec = "NOT consuming again within 2m"
	}
	line := fmt.Sprintf("%s node %d (leader of %d of %d partitions, %d with work): %s, fault took %s", kind, node, count(lead, node), c.mon.commandParts(), len(base), rec,
		time.Since(start).Round(100*time.Millisecond))
	r.timeline = append(r.timeline, line)
	c.t.Logf("chaos-topology: %s", line)
}

// workBatch writes 1,000 commands with acks=all, so that partitions have
// work around a fault; when names the moment in an error.
func (r *topoRun) workBatch(ctx context.Context, c *chaosRun, when string) ([]*kgo.Record, bool) {
	b := make([]*kgo.Record, 0, 1000)
	for len(b) < cap(b) {
		b = append(b, recoveryBatch(r.rnd, scale{recoveryBatch: 1, accountsB: c.sc.accountsB})...)
	}
	if err := r.produce(ctx, r.prodCl, b); err != nil {
		c.t.Errorf("chaos: the batch %s: %v", when, err)
		return nil, false
	}
	return b, true
}

func count(lead map[int]int, node int) int {
	n := 0
	for _, l := range lead {
		if l == node {
			n++
		}
	}
	return n
}

// summary prints each fault kind with its recovery times, then the audit's
// summary line.
func (r *topoRun) summary(t *testing.T, f *findings, ackedLost int) {
	t.Helper()
	for _, k := range r.cfg.kinds {
		ds := slices.Clone(r.recovered[k])
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		fig := "none measured"
		if len(ds) > 0 {
			fig = fmt.Sprintf("median %s max %s", ds[len(ds)/2].Round(100*time.Millisecond), ds[len(ds)-1].Round(100*time.Millisecond))
		}
		t.Logf("chaos-topology: fault %s ×%d: recovery (every partition with work consuming again) %v, %s, %d not within 2m",
			k, r.done[k], roundAll(r.recovered[k]), fig, r.unrecov[k])
	}
	t.Logf("chaos-topology: lost=%d doubled=%d wrong=%d missing-events=%d acked-lost=%d unapplied=%d phantom=%d aborted-applied=%d extra-events=%d stray-events=%d commands=%d problems=%d%s",
		f.lostAccounts, f.doubledAccounts, f.wrongAccounts, f.missingEvents, ackedLost, f.unapplied, f.phantom, f.abortedApplied, f.extraEvents, f.strayEvents,
		f.commands, len(f.problems), topoExtra(f))
}

func TestTopoKinds(t *testing.T) {
	if got, err := topoKinds(""); err != nil || !slices.Equal(got, topoFaultKinds) {
		t.Fatalf("all kinds: %v %v", got, err)
	}
	if got, err := topoKinds(" controller-kill,leader-kill,controller-kill"); err != nil || !slices.Equal(got, []string{"controller-kill", "leader-kill"}) {
		t.Fatalf("two kinds: %v %v", got, err)
	}
	if _, err := topoKinds("leader-kill,leader-kil"); err == nil || !strings.Contains(err.Error(), "leader-kil\"") {
		t.Fatalf("a misspelt kind: %v", err)
	}
}

// TestAckSetMissing checks the acknowledged-records check on its own: a
// record acknowledged but absent from the log is a problem, one present (in
// any copy) is not.
func TestAckSetMissing(t *testing.T) {
	a := &ackSet{}
	a.add([]*kgo.Record{record(srcMain, "a-1", []byte(`{}`), "u1"), record(srcMain, "a-2", []byte(`{}`), "u2"), record(srcMain, "a-3", []byte(`{}`), "u3")})
	f := &findings{}
	if n := a.missing([]rec{{uuid: "u1"}, {uuid: "u3"}, {uuid: "u3"}}, f); n != 1 || len(f.problems) != 1 || !strings.Contains(f.problems[0], "u2") {
		t.Fatalf("missing = %d, problems %q; want 1 naming u2", n, f.problems)
	}
	var none *ackSet // a run that tracks nothing
	none.add([]*kgo.Record{record(srcMain, "a-1", []byte(`{}`), "u1")})
	if n := none.missing(nil, &findings{}); n != 0 {
		t.Fatalf("nil set: missing = %d, want 0", n)
	}
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	commandsTopic = "ledger.commands"
	eventsTopic   = "ledger.events"
	dlqTopic      = "ledger.dlq"
	partitions    = 6
	group         = "ledger-consumer" // the worker's consumer group
	// sessionTimeout is the workers' consumer-group session timeout
	// (--session-timeout): the time from a crash to the crashed worker's
	// partitions being consumed again. The suite's broker allows 1s.
	sessionTimeout = 3 * time.Second
)

// options select the run; CHAOS_* environment variables set them.
type options struct {
	seed        uint64
	long        bool
	txns        bool // transactional producers, which commit some transactions and abort others
	cross       bool // a producer with another partitioner writes B accounts' top-ups and copies
	startupWait bool // a worker started while the broker is down must wait for it
	// batch: the workers with an odd id run in batch mode, batches of up to
	// this many commands (--batch), alongside per-message ones in one
	// group; 0 runs every worker per message.
	batch int
	// keyLayout is the workers' --key-layout: "partitioned" (the default)
	// or "single-table"; keyMaintenance forces the partitioned layout's
	// maintenance (keys_test.go).
	keyLayout      string
	keyMaintenance bool
	// transport is the workers' --transport: "kafka-go" (the default) or
	// "franz-go"; static makes each franz-go worker a static member
	// (--instance-id chaos-<id>, the same at each restart).
	transport string
	static    bool
	// pooler puts PgBouncer in transaction mode between the workers and
	// Postgres (pooler_test.go).
	pooler bool
}

func envBool(k string, def bool) bool {
	v, err := strconv.ParseBool(os.Getenv(k))
	if err != nil {
		return def
	}
	return v
}

// keyEnv is the environment that repeats the run's key layout.
func (o options) keyEnv() string {
	env := ""
	if o.keyLayout != "partitioned" {
		env += " CHAOS_KEY_LAYOUT=" + o.keyLayout
	}
	if o.keyMaintenance {
		env += " CHAOS_KEY_MAINTENANCE=1"
	}
	if o.transport != "kafka-go" {
		env += " CHAOS_TRANSPORT=" + o.transport
	}
	if o.static {
		env += " CHAOS_STATIC=1"
	}
	if o.pooler {
		env += " CHAOS_POOLER=1"
	}
	return env
}

func loadOptions() options {
	o := options{seed: uint64(time.Now().UnixNano()), long: envBool("CHAOS_LONG", false), txns: envBool("CHAOS_TRANSACTIONS", true),
		cross: envBool("CHAOS_CROSS_PARTITION", true), startupWait: envBool("CHAOS_STARTUP_WAIT", true)}
	if s, err := strconv.ParseUint(os.Getenv("CHAOS_SEED"), 10, 64); err == nil {
		o.seed = s
	}
	o.batch = 200
	o.keyLayout = "partitioned"
	if l := os.Getenv("CHAOS_KEY_LAYOUT"); l != "" {
		o.keyLayout = l
	}
	o.keyMaintenance = envBool("CHAOS_KEY_MAINTENANCE", false)
	o.transport = "kafka-go"
	if tr := os.Getenv("CHAOS_TRANSPORT"); tr != "" {
		o.transport = tr
	}
	o.static = envBool("CHAOS_STATIC", false)
	o.pooler = envBool("CHAOS_POOLER", false)
	if b, err := strconv.Atoi(os.Getenv("CHAOS_BATCH")); err == nil && b >= 0 {
		o.batch = b
	}
	return o
}

func (o options) repro() string {
	env := fmt.Sprintf("CHAOS_SEED=%d", o.seed)
	if o.long {
		env += " CHAOS_LONG=1"
	} else {
		env += " CHAOS=1"
	}
	if !o.txns {
		env += " CHAOS_TRANSACTIONS=0"
	}
	if !o.cross {
		env += " CHAOS_CROSS_PARTITION=0"
	}
	if !o.startupWait {
		env += " CHAOS_STARTUP_WAIT=0"
	}
	if o.batch != 200 {
		env += fmt.Sprintf(" CHAOS_BATCH=%d", o.batch)
	}
	return env + o.keyEnv() + " go test -race -count=1 -timeout 20m -run 'TestChaos$' -v ./systest/chaos/"
}

type scale struct {
	commands, accountsA, accountsB      int
	kills, pgRestarts, brokerCrashes    int
	workerStops, pgPauses, brokerPauses int
	restores                            int // restore_test.go
	gapMin, gapMax                      time.Duration
	chunks                              int
	chunkGap                            time.Duration
	drain                               time.Duration
	recoveryBatch, recoveryKills        int
	workers                             int
}

func scaleOf(long bool) scale {
	if long {
		return scale{commands: 18000, accountsA: 60, accountsB: 1500, kills: 32, pgRestarts: 2, brokerCrashes: 2, workerStops: 2, pgPauses: 3, brokerPauses: 3, restores: 1,
			gapMin: time.Second, gapMax: 3 * time.Second, chunks: 20, chunkGap: 6 * time.Second, drain: 5 * time.Minute, workers: 3, recoveryBatch: 4500, recoveryKills: 3}
	}
	return scale{commands: 3000, accountsA: 30, accountsB: 300, kills: 14, pgRestarts: 1, brokerCrashes: 1, workerStops: 1, pgPauses: 1, brokerPauses: 1, restores: 1,
		gapMin: 500 * time.Millisecond, gapMax: 1500 * time.Millisecond, chunks: 8, chunkGap: 2 * time.Second, drain: 150 * time.Second, workers: 3, recoveryBatch: 3000, recoveryKills: 1}
}

// counts are the faults the run injected.
type counts struct {
	kills, killsMidTx, workerRestarts, pgRestarts, brokerRestarts atomic.Int64
	pauses, workerStops                                           atomic.Int64
	restores                                                      atomic.Int64
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: the chaos suite does not run under -short; make chaos-short runs its short version, make chaos the long one")
	}
	o := loadOptions()
	if !o.long && !envBool("CHAOS", true) {
		t.Skip("chaos: switched off with CHAOS=0")
	}
	sc := scaleOf(o.long)
	if k, err := strconv.Atoi(os.Getenv("CHAOS_RECOVERY_KILLS")); err == nil && k >= 0 {
		sc.recoveryKills, sc.recoveryBatch = k, max(sc.recoveryBatch, 1500*k)
	}
	runChaos(t, o, sc, nil)
}

// runChaos runs one chaos run: on the suite's single broker when topo is
// nil, else on a cluster of brokers with topo's faults (topology_test.go).
func runChaos(t *testing.T, o options, sc scale, topo *topology) {
	repro := o.repro()
	if topo != nil {
		repro = topo.repro(o)
	}
	t.Logf("chaos: seed %d (repeat: %s)", o.seed, repro)
	if o.keyLayout != "partitioned" && o.keyLayout != "single-table" {
		t.Fatalf("chaos: CHAOS_KEY_LAYOUT is %q: set it to partitioned or single-table", o.keyLayout)
	}
	if o.keyMaintenance && o.keyLayout != "partitioned" {
		t.Fatalf("chaos: CHAOS_KEY_MAINTENANCE needs the partitioned layout")
	}
	if o.transport != "kafka-go" && o.transport != "franz-go" {
		t.Fatalf("chaos: CHAOS_TRANSPORT is %q: set it to kafka-go or franz-go", o.transport)
	}
	if o.static && o.transport != "franz-go" {
		t.Fatalf("chaos: CHAOS_STATIC needs CHAOS_TRANSPORT=franz-go")
	}
	if o.pooler && topo != nil {
		t.Fatalf("chaos: CHAOS_POOLER runs on the single broker's suite, not the topology run")
	}
	partitioned := o.keyLayout == "partitioned"
	base, err := os.MkdirTemp("", "exactly-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("chaos: logs of the workers, Postgres and the broker are kept in %s", base)
			return
		}
		_ = os.RemoveAll(base)
	})
	root := moduleRoot(t)
	phases := []string{}
	phase, phaseStart := "setup", time.Now()
	next := func(name string) {
		phases = append(phases, fmt.Sprintf("%s %s", phase, time.Since(phaseStart).Round(time.Second)))
		phase, phaseStart = name, time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The worker binary, a Postgres cluster and a broker of the suite's own,
	// prepared at the same time.
	requireTools(t)
	bin := filepath.Join(base, "ledger-consumer")
	var buildErr, brErr error
	var br *broker
	var kc3 *kcluster
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		cmd := exec.Command("go", "build", "-o", bin, "./examples/ledger-consumer")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./examples/ledger-consumer: %v\n%s", err, out)
		}
	}()
	go func() {
		defer wg.Done()
		if topo != nil {
			kc3, brErr = startCluster(root, base, topo.nodes, topo.usesNet())
			return
		}
		br, brErr = startBroker(root, base)
	}()
	pg := newPGCluster(t, base)
	dbURL := pg.URL()
	var pair *pgPair
	if topo.usesPair() { // standby_test.go
		pair = newPGPair(t, pg, base)
		dbURL = pair.DSN()
	}
	wg.Wait()
	if br != nil {
		t.Cleanup(func() { _ = br.do("stop") })
	}
	if kc3 != nil {
		t.Cleanup(func() { _ = kc3.do("stop") })
	}
	if brErr != nil {
		t.Fatal(brErr)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	var brokers []string
	rf := 1
	if kc3 != nil {
		brokers, rf = kc3.addrs(), kc3.n
	} else {
		brokers = []string{br.Addr()}
	}
	// With a net-* kind the workers reach every server through a proxy
	// (netfault_test.go); everything else connects directly.
	workerDB, workerBrokers := dbURL, brokers
	var np *netProxies
	if topo.usesNet() {
		pgPorts := []int{pg.Port}
		if pair != nil {
			pgPorts = []int{pair.nodes[0].Port, pair.nodes[1].Port}
		}
		np, err = newNetProxies(t, o.seed, pgPorts, kc3.aports, kc3.qports)
		if err != nil {
			t.Fatal(err)
		}
		workerDB, workerBrokers = np.url(dbURL), np.brokers()
		if workerDB == dbURL {
			t.Fatalf("chaos: no proxy for the Postgres of %s", dbURL)
		}
	}
	var bouncer *pgBouncer
	if o.pooler {
		// The workers reach Postgres through PgBouncer in transaction mode
		// (pooler_test.go); migrations, the audit and the faults connect
		// directly.
		if bouncer, err = startPgBouncer(ctx, t, root, base, pg.Port); err != nil {
			t.Fatal(err)
		}
		workerDB = bouncer.workerURL()
	}
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	res, err := kc.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: commandsTopic, NumPartitions: partitions, ReplicationFactor: rf},
		{Topic: eventsTopic, NumPartitions: 3, ReplicationFactor: rf},
		{Topic: dlqTopic, NumPartitions: 1, ReplicationFactor: rf}}})
	if err != nil {
		t.Fatal(err)
	}
	for topic, err := range res.Errors {
		if err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
	}

	rnd := &workloadRand{Rand: rand.New(rand.NewPCG(o.seed, o.seed^0x9e3779b97f4a7c15)), mixed: partitioned}

	// Production workers run without DDL rights: the tables come from one
	// migrate step before any worker starts.
	if out, err := exec.Command(bin, "migrate", "--database-url", dbURL, "--schema", "ledger").CombinedOutput(); err != nil {
		t.Fatalf("ledger migrate: %v\n%s", err, out)
	}
	var n counts
	ws := &workers{restarts: &n.workerRestarts, bin: bin, dir: base, batch: o.batch, transport: o.transport, static: o.static, args: []string{"worker", "--database-url", workerDB, "--brokers", strings.Join(workerBrokers, ","),
		"--schema", "ledger", "--commands", commandsTopic, "--metrics-addr", "127.0.0.1:0",
		"--session-timeout", sessionTimeout.String()}}
	switch {
	case o.keyMaintenance:
		// Partition maintenance every second, on partitions 2s wide
		// (keys_test.go); the workers' role owns the tables, as the layout
		// needs (it runs DDL).
		if err := narrowPartitions(ctx, pool); err != nil {
			t.Fatal(err)
		}
		ws.args = append(ws.args, "--key-cleanup", keyCleanup.String())
	case !partitioned:
		ws.args = append(ws.args, "--key-layout", o.keyLayout)
	}
	// The restore fault puts the ledger back to this moment: before any
	// position was saved.
	if err := snapshotLedger(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < sc.workers; i++ {
		w := &worker{id: i, extra: ws.modeArgs(i)}
		ws.all = append(ws.all, w)
		if err := ws.start(w); err != nil {
			t.Fatal(err)
		}
	}
	defer ws.stopAll()
	if o.transport == "franz-go" {
		// The workers are franz-go's: cooperative-sticky members, static
		// with CHAOS_STATIC.
		if err := waitMembers(ctx, brokers, sc.workers, o.static, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var firstLow time.Time
	if partitioned {
		// The UUIDv7s are minted as the workload is generated: once the
		// first time partitions exist and the workers consume, so that they
		// land in them.
		if firstLow, err = waitPartitions(ctx, pool, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := waitConsuming(ctx, brokers, sc.workers, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	wl := generate(rnd, genConfig{commands: sc.commands, accountsA: sc.accountsA, accountsB: sc.accountsB, crossParts: o.cross})

	mainCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(commandsTopic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer mainCl.Close()
	altCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(commandsTopic), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))))
	if err != nil {
		t.Fatal(err)
	}
	defer altCl.Close()

	mon := newMonitor(brokers, pool)
	go mon.run(ctx)
	// In a topology run every record the producers had acknowledged must be
	// in the log at the end, whichever broker died.
	var acked *ackSet
	if topo != nil {
		acked = &ackSet{}
	}
	produce := func(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
		err := produce(ctx, cl, recs)
		if err == nil {
			acked.add(recs)
		}
		return err
	}

	// Production: the main stream and the other partitioner's records in
	// chunks while the faults run; transactional producers all along.
	var prodErr atomic.Value
	var prodWG sync.WaitGroup
	faultsDone := make(chan struct{})
	prodWG.Add(1)
	go func() {
		defer prodWG.Done()
		for i := 0; i < sc.chunks; i++ {
			lo, hi := i*len(wl.main)/sc.chunks, (i+1)*len(wl.main)/sc.chunks
			if err := produce(ctx, mainCl, wl.main[lo:hi]); err != nil {
				prodErr.Store(fmt.Errorf("main producer: %w", err))
				return
			}
			lo, hi = i*len(wl.alt)/sc.chunks, (i+1)*len(wl.alt)/sc.chunks
			if err := produce(ctx, altCl, wl.alt[lo:hi]); err != nil {
				prodErr.Store(fmt.Errorf("other-partitioner producer: %w", err))
				return
			}
			select {
			case <-time.After(sc.chunkGap): // pacing: spread the stream over the faults
			case <-faultsDone:
			}
		}
	}()
	for i := 0; i < 2 && o.txns; i++ {
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			runTxnProducer(ctx, brokers, fmt.Sprintf("chaos-txn-%d", i), o, sc, rand.New(rand.NewPCG(o.seed+uint64(i)+1, 7)), faultsDone)
		}()
	}

	// Faults.
	ch := &chaosRun{t: t, o: o, sc: sc, ws: ws, pg: pg, br: br, pool: pool, n: &n, mon: mon, rnd: rand.New(rand.NewPCG(o.seed, 99))}
	if topo != nil {
		ch.topo = newTopoRun(topo, kc3, brokers, mainCl, produce, &workloadRand{Rand: rand.New(rand.NewPCG(o.seed, 1234))})
		ch.topo.pg, ch.topo.net = pair, np
	}
	next("faults")
	faultStart := time.Now()
	ch.runPlan(ctx)
	faultTime := time.Since(faultStart)
	close(faultsDone)
	prodWG.Wait()
	if err, _ := prodErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	// Late copies, then one end marker per partition.
	if err := produce(ctx, mainCl, wl.late); err != nil {
		t.Fatalf("late copies: %v", err)
	}
	if err := produce(ctx, altCl, wl.lateAlt); err != nil {
		t.Fatalf("late copies (other partitioner): %v", err)
	}
	// Recovery time: a batch to consume, and kills one at a time with
	// nothing else failing.
	if err := produce(ctx, mainCl, recoveryBatch(rnd, sc)); err != nil {
		t.Fatalf("recovery batch: %v", err)
	}
	next("recovery")
	recTimes, recSkipped := ch.measureRecovery(ctx, sc.recoveryKills)
	endCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(commandsTopic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	var ends []*kgo.Record
	for p := 0; p < mon.commandParts(); p++ {
		r := record(srcEnd, "end", []byte(`{"end_of_run":`+strconv.Itoa(p)+`}`), rnd.id())
		r.Partition = int32(p)
		ends = append(ends, r)
	}
	if err := produce(ctx, endCl, ends); err != nil {
		t.Fatalf("end markers: %v", err)
	}
	endCl.Close()

	// Drain: the group's committed offsets reach the log end and the outbox
	// is empty.
	next("drain")
	drainStart := time.Now()
	lag, drainErr := mon.waitDrained(ctx, sc.drain)
	drain := time.Since(drainStart)
	ws.stopAll()
	cancel()
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer acancel()

	endSeen := func(_ map[int32]int64, recs []rec) bool {
		seen := map[int32]bool{}
		for _, r := range recs {
			if r.src == srcEnd {
				seen[r.part] = true
			}
		}
		return len(seen) == mon.commandParts()
	}
	committed, err := readTopic(actx, brokers, commandsTopic, mon.commandParts(), true, endSeen)
	if err != nil {
		t.Fatal(err)
	}
	all, err := readTopic(actx, brokers, commandsTopic, mon.commandParts(), false, endSeen)
	if err != nil {
		t.Fatal(err)
	}
	events, err := readToEnd(actx, brokers, eventsTopic, 3)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := readToEnd(actx, brokers, dlqTopic, 1)
	if err != nil {
		t.Fatal(err)
	}
	db, err := readDB(actx, pool, partitioned)
	if err != nil {
		t.Fatal(err)
	}
	f := audit(committed, all, events, dlq, db, n.restores.Load() > 0)
	var ks *keyStats
	if partitioned {
		if ks, err = readKeyStats(actx, pool, firstLow, committed, db); err != nil {
			t.Fatal(err)
		}
		ks.check(f, o.keyMaintenance)
	}
	ackedLost := acked.missing(all, f)
	if bouncer != nil {
		t.Logf("chaos: pooler: %s", bouncer.check(actx, f, o.batch))
	}
	next("")
	if drainErr != nil {
		f.fail("drain", "%v (lag by partition %v)", drainErr, lag)
	}
	ws.mu.Lock()
	exits := append([]string(nil), ws.exits...)
	ws.mu.Unlock()
	for _, e := range ch.startupProblems {
		f.fail("startup", "%s", e)
	}
	rec := fmt.Sprintf("%v (%d not measured; under chaos: %s)", roundAll(recTimes), recSkipped, mon.recoveries())
	t.Logf("chaos: seed=%d modes=%s commands=%d duplicates=%d txn-committed=%d aborted=%d kills=%d (mid-transaction %d) restarts=%d (workers %d, postgres %d, broker %d) pauses=%d (sigstop %d) restores=%d self-exits=%d lost=%d (%d) doubled=%d (%d) wrong=%d unapplied=%d phantom=%d aborted-applied=%d missing-events=%d extra-events=%d (differing %d) stray-events=%d dead-lettered=%d (missing %d, unexpected %d) faults=%s drain=%s recovery=%s",
		o.seed, ws.modes(), f.commands, f.copies, f.committedTxnRecs, f.abortedRecs, n.kills.Load(), n.killsMidTx.Load(),
		n.workerRestarts.Load()+n.pgRestarts.Load()+n.brokerRestarts.Load(), n.workerRestarts.Load(), n.pgRestarts.Load(), n.brokerRestarts.Load(),
		n.pauses.Load(), n.workerStops.Load(), n.restores.Load(), len(exits), f.lostAccounts, f.lostAmount, f.doubledAccounts, f.doubledAmount, f.wrongAccounts,
		f.unapplied, f.phantom, f.abortedApplied, f.missingEvents, f.extraEvents, f.differingEvents, f.strayEvents, f.deadLettered, f.dlqMissing, f.dlqUnexpected,
		faultTime.Round(time.Second), drain.Round(100*time.Millisecond), rec)
	t.Logf("chaos: faults other than kills: %s; phases: %s", strings.Join(ch.timeline, ", "), strings.Join(phases, ", "))
	if ks != nil {
		t.Logf("chaos: keys: %s", ks)
	}
	logExits(t, exits)
	if len(f.problems) > 0 {
		report(t, f.problems)
		t.Errorf("chaos: %d problems (seed %d); repeat with: %s", len(f.problems), o.seed, repro)
	}
	if ch.topo != nil {
		ch.topo.summary(t, f, ackedLost) // the last line: the fault kinds, then the audit's zeros
	}
}

// report prints the problems, at most 15 of each kind.
func report(t *testing.T, problems []string) {
	t.Helper()
	byKind := map[string][]string{}
	var kinds []string
	for _, p := range problems {
		k := p[:strings.IndexByte(p, ':')]
		if _, ok := byKind[k]; !ok {
			kinds = append(kinds, k)
		}
		byKind[k] = append(byKind[k], p)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		ps := byKind[k]
		sort.Strings(ps)
		t.Logf("chaos: %d %s problems", len(ps), k)
		for i, p := range ps {
			if i == 15 {
				t.Logf("  … %d more", len(ps)-15)
				break
			}
			t.Logf("  %s", p)
		}
	}
}

func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	h.Write(b)
	return h.Sum32()
}

// runTxnProducer writes transactions of B-account top-ups until the faults
// are over; each commits or (with aborts on) aborts at random. A failing
// client is replaced by a new one with the same transactional ID, which
// fences the old one and aborts its open transaction.
func runTxnProducer(ctx context.Context, brokers []string, id string, o options, sc scale, rnd *rand.Rand, stop <-chan struct{}) {
	r := &workloadRand{Rand: rnd, mixed: o.keyLayout == "partitioned"}
	newClient := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(commandsTopic), kgo.TransactionalID(id),
			kgo.TransactionTimeout(20*time.Second))
		if err != nil {
			return nil
		}
		return cl
	}
	cl := newClient()
	defer func() {
		if cl != nil {
			cl.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(150 * time.Millisecond): // pacing between transactions
		}
		if cl == nil {
			if cl = newClient(); cl == nil {
				continue
			}
		}
		commit := r.Float64() < 0.5
		err := func() error {
			if err := cl.BeginTransaction(); err != nil {
				return err
			}
			var recs []*kgo.Record
			for i := 0; i < 4; i++ {
				c := command{CommandID: r.id(), Type: typeTopup, Account: fmt.Sprintf("b-%03d", r.IntN(sc.accountsB)), Amount: 1 + r.Int64N(100)}
				payload, _ := json.Marshal(c)
				recs = append(recs, record(srcTxn, c.Account, payload, c.CommandID))
			}
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			perr := cl.ProduceSync(pctx, recs...).FirstErr()
			if perr != nil {
				commit = false
			}
			if err := cl.EndTransaction(pctx, kgo.TransactionEndTry(commit)); err != nil {
				return err
			}
			return perr
		}()
		if err != nil {
			cl.Close()
			cl = nil
		}
	}
}

// recoveryBatch is top-ups of B accounts for the recovery measurement.
func recoveryBatch(rnd *workloadRand, sc scale) []*kgo.Record {
	out := make([]*kgo.Record, 0, sc.recoveryBatch)
	for i := 0; i < sc.recoveryBatch; i++ {
		c := command{CommandID: rnd.id(), Type: typeTopup, Account: fmt.Sprintf("b-%03d", rnd.IntN(sc.accountsB)), Amount: 1 + rnd.Int64N(100)}
		payload, _ := json.Marshal(c)
		out = append(out, record(srcMain, c.Account, payload, c.CommandID))
	}
	return out
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// logExits prints the workers' own exits, one line per distinct cause.
func logExits(t *testing.T, exits []string) {
	t.Helper()
	causes := map[string]int{}
	var order []string
	for _, e := range exits {
		cause := e[strings.Index(e, "exited on its own"):]
		if causes[cause] == 0 {
			order = append(order, cause)
		}
		causes[cause]++
	}
	for _, c := range order {
		t.Logf("chaos: %d× a worker %s", causes[c], c)
	}
}

// produce writes recs and sends again, for up to three minutes, the ones
// that failed (the broker may be down or just restarted). A record that was
// written although its produce failed is written twice: an exact copy, which
// the audit counts as one; the audit takes the order from the log, not from
// recs.
func produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	deadline := time.Now().Add(3 * time.Minute)
	for len(recs) > 0 {
		var failed []*kgo.Record
		var last error
		for _, r := range cl.ProduceSync(ctx, recs...) {
			if r.Err != nil {
				c := &kgo.Record{Key: r.Record.Key, Value: r.Record.Value, Headers: r.Record.Headers, Partition: r.Record.Partition}
				failed, last = append(failed, c), r.Err
			}
		}
		if len(failed) > 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
			return fmt.Errorf("%d records not written: %w", len(failed), last)
		}
		if len(failed) > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond): // back-off before sending again
			}
		}
		recs = failed
	}
	return nil
}

package rebalancebench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// The stall of a consumer-group rebalance, per group protocol and event:
//
//	TEST_KAFKA_BROKERS=127.0.0.1:9092 go test -run '^$' -bench Rebalance -benchtime 1x -timeout 60m ./internal/rebalancebench
//
// For each mode (eager, cooperative, static, kip848; kgopubsub refuses a
// static member on KIP-848's protocol) and scenario, on a new
// topic of `partitions` partitions that a producer writes a record to, per
// partition, every `produceEvery`, and in a new group:
//
//   - join: two workers, then a third joins;
//   - restart: three workers, each in turn stopped with SIGTERM (the
//     Subscriber closes: drains, commits, leaves unless static) and started
//     again at once (static: with the same InstanceID);
//   - kill: three workers, one killed with SIGKILL and not started again;
//   - kill-restart: as kill, and the killed worker started again at once
//     (static: with its InstanceID, within the session timeout).
//
// Every worker is a process that acks each message as it arrives and
// reports it with its time. An event's window runs from the event to the
// group's next steady state (every partition consumed in the last second
// by a live worker, every live worker consuming, and no partition changing
// hands for settleFor). A partition is unmoved when one worker that lived
// through the event consumed all of it in the window; the others are moved
// (their owner changed, or was the worker stopped or killed). The figures
// are the longest time between two consecutive receipts of a partition's
// messages in the window (unmoved and moved apart), and the same for every
// partition over the baselineFor before the event: the gap that is no
// stall. rebalances is the generation's rise over the window, as the
// workers' joins report it (classic protocol), or the group epoch's as
// ConsumerGroupDescribe gives it (KIP-848).
//
// The workers' logs, each run's event times and (with
// REBALANCEBENCH_RECEIPTS=1) every receipt go to a directory under
// os.TempDir that the benchmark logs (-v).
//
// The library defaults are used for session timeout, heartbeat and
// rebalance timeout; KIP-848's session timeout and heartbeat interval are
// the broker's (group.consumer.*), printed at the start.
func BenchmarkRebalance(b *testing.B) {
	if os.Getenv("TEST_KAFKA_BROKERS") == "" {
		b.Skip("TEST_KAFKA_BROKERS is not set: the rebalance benchmark runs against a real Kafka broker")
	}
	brokers := kafkatest.Brokers(b)
	logs, err := os.MkdirTemp("", "rebalancebench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("workers' logs in %s", logs)
	printDefaults(b, brokers)
	for _, mode := range []string{modeEager, modeCooperative, modeStatic, modeKIP848} {
		b.Run(mode, func(b *testing.B) {
			for _, sc := range []string{"join", "restart", "kill", "kill-restart"} {
				b.Run(sc, func(b *testing.B) {
					for i := 0; i < b.N; i++ {
						r := newRun(b, brokers, mode, sc, filepath.Join(logs, fmt.Sprintf("%s-%s-%d", mode, sc, i)))
						r.scenario()
						r.close()
					}
				})
			}
		})
	}
}

const (
	partitions   = 12
	produceEvery = 10 * time.Millisecond
	// settleFor is how long no partition may change hands for the group to
	// be steady; a cooperative rebalance takes two rounds.
	settleFor   = 3 * time.Second
	baselineFor = 5 * time.Second
	steadyWait  = 3 * time.Minute
)

func printDefaults(b *testing.B, brokers []string) {
	fmt.Printf("rebalance: load %s\n", loadavg())
	fmt.Println("rebalance: client settings: library defaults (kafkapubsub and kgopubsub document SessionTimeout 10s, HeartbeatInterval 1s, RebalanceTimeout 30s, CommitInterval 200ms, MaxInFlight 1)")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	bs, err := adm.ListBrokers(ctx)
	if err != nil {
		b.Logf("brokers: %v", err)
		return
	}
	rcs, err := adm.DescribeBrokerConfigs(ctx, bs.NodeIDs()...)
	if err != nil {
		b.Logf("broker configs: %v", err)
		return
	}
	var kv []string
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			switch c.Key {
			case "group.consumer.session.timeout.ms", "group.consumer.heartbeat.interval.ms", "group.consumer.assignors",
				"group.initial.rebalance.delay.ms", "group.min.session.timeout.ms", "group.consumer.min.session.timeout.ms":
				v := "<nil>"
				if c.Value != nil {
					v = *c.Value
				}
				kv = append(kv, c.Key+"="+v)
			}
		}
	}
	slices.Sort(kv)
	fmt.Printf("rebalance: broker %s\n", strings.Join(kv, " "))
}

func loadavg() string {
	bs, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(bs))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// receipt is one message a worker received.
type receipt struct {
	at     int64 // unix nanoseconds, the worker's clock
	offset int64
	proc   int
}

// proc is one worker process.
type proc struct {
	name   string // w1, w2, w3: the InstanceID's suffix, kept over restarts
	cmd    *exec.Cmd
	exited chan struct{}
}

type run struct {
	b            *testing.B
	brokers      []string
	mode, sc     string
	topic, group string
	logs         string
	adm          *kadm.Client
	admCl        *kgo.Client
	stopProduce  func() (produced, failed int64)

	mu      sync.Mutex
	procs   []*proc
	parts   [partitions][]receipt
	last    [partitions]int64 // latest receipt per partition
	owner   [partitions]int   // the proc of the latest receipt, -1 before any
	changed int64             // the last time a partition changed hands
	gen     int32             // the highest generation a worker joined
	stats   []eventStats
}

func newRun(b *testing.B, brokers []string, mode, sc, logs string) *run {
	if err := os.MkdirAll(logs, 0o755); err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	r := &run{b: b, brokers: brokers, mode: mode, sc: sc, logs: logs, topic: kafkatest.Name("rebalance"),
		group: kafkatest.Name("rebalance-" + mode), adm: kadm.NewClient(cl), admCl: cl}
	for p := range r.owner {
		r.owner[p] = -1
	}
	kafkatest.CreateTopicOn(b, brokers, r.topic, partitions)
	r.stopProduce = produce(b, brokers, r.topic)
	return r
}

// produce writes a record to every partition of topic every produceEvery
// until the returned func is called.
func produce(b *testing.B, brokers []string, topic string) func() (int64, int64) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var produced, failed int64
	done := func(_ *kgo.Record, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed++
		} else {
			produced++
		}
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(produceEvery)
		defer t.Stop()
		value := make([]byte, 100)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for p := int32(0); p < partitions; p++ {
				cl.TryProduce(context.Background(), &kgo.Record{Partition: p, Value: value}, done)
			}
		}
	}()
	return func() (int64, int64) {
		close(stop)
		<-stopped
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cl.Flush(ctx)
		cl.Close()
		mu.Lock()
		defer mu.Unlock()
		return produced, failed
	}
}

// start starts worker name and returns its proc index.
func (r *run) start(name string) int {
	r.mu.Lock()
	i := len(r.procs)
	r.mu.Unlock()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), workerEnv+"=1", modeEnv+"="+r.mode, brokersEnv+"="+strings.Join(r.brokers, ","),
		topicEnv+"="+r.topic, groupEnv+"="+r.group, instanceEnv+"="+r.group+"-"+name)
	stderr, err := os.Create(filepath.Join(r.logs, fmt.Sprintf("%s.%d.log", name, i)))
	if err != nil {
		r.b.Fatal(err)
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.b.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.line(i, sc.Text())
		}
		_ = cmd.Wait()
		_ = stderr.Close()
		close(p.exited)
	}()
	return i
}

func (r *run) line(proc int, l string) {
	f := strings.Fields(l)
	switch {
	case len(f) == 4 && f[0] == "r":
		p, err1 := strconv.Atoi(f[1])
		off, err2 := strconv.ParseInt(f[2], 10, 64)
		at, err3 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || p < 0 || p >= partitions {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.parts[p] = append(r.parts[p], receipt{at: at, offset: off, proc: proc})
		if at > r.last[p] {
			r.last[p] = at
		}
		if r.owner[p] != proc {
			r.owner[p] = proc
			r.changed = time.Now().UnixNano()
		}
	case len(f) == 2 && f[0] == "g":
		g, err := strconv.ParseInt(f[1], 10, 32)
		if err != nil {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.gen = max(r.gen, int32(g))
	}
}

// steady waits until the group is steady with live as its members and
// returns when it was; ok is false if it was not within steadyWait.
func (r *run) steady(live ...int) (at time.Time, ok bool) {
	deadline := time.Now().Add(steadyWait)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		now := time.Now().UnixNano()
		r.mu.Lock()
		good := now-r.changed >= int64(settleFor)
		owns := map[int]bool{}
		for p := range partitions {
			if now-r.last[p] > int64(time.Second) || !slices.Contains(live, r.owner[p]) {
				good = false
			}
			owns[r.owner[p]] = true
		}
		for _, l := range live {
			if !owns[l] {
				good = false
			}
		}
		r.mu.Unlock()
		if good {
			return time.Now(), true
		}
	}
	return time.Now(), false
}

// epoch is the group epoch (KIP-848) or the highest generation a worker
// joined (classic).
func (r *run) epoch() int32 {
	if r.mode == modeKIP848 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ds, err := r.adm.DescribeConsumerGroups(ctx, r.group)
		if err != nil || ds[r.group].Err != nil {
			r.b.Logf("ConsumerGroupDescribe %s: %v %v", r.group, err, ds[r.group].Err)
			return -1
		}
		return ds[r.group].Epoch
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// eventStats are one event's figures.
type eventStats struct {
	unmoved, moved          int
	unmovedGap, movedGap    time.Duration
	baseline                time.Duration
	genBefore, genAfter     int32
	settled                 time.Duration
	steady                  bool
	unmovedParts, movedPart []int
}

// event runs action as the event and measures it: the group must be
// steady with before as members; after is who it should settle with.
func (r *run) event(label string, before, after []int, action func() []int) {
	r.b.Helper()
	if _, ok := r.steady(before...); !ok {
		r.b.Fatalf("%s %s: the group was not steady with %d workers in %v", r.mode, r.sc, len(before), steadyWait)
	}
	time.Sleep(baselineFor)
	g0 := r.epoch()
	t0 := time.Now()
	r.note("event %s start %d", label, t0.UnixNano())
	if got := action(); got != nil {
		after = got
	}
	tEnd, ok := r.steady(after...)
	r.note("event %s steady %d", label, tEnd.UnixNano())
	g1 := r.epoch()
	st := r.measure(t0, tEnd)
	st.genBefore, st.genAfter, st.settled, st.steady = g0, g1, tEnd.Sub(t0), ok
	r.stats = append(r.stats, st)
	fmt.Printf("rebalance: mode=%s scenario=%s event=%s unmoved=%d unmoved_max_gap=%.2fs moved=%d moved_max_gap=%.2fs baseline_gap=%.2fs rebalances=%d (%d->%d) settled=%.1fs steady=%v unmoved_partitions=%v load=%s\n",
		r.mode, r.sc, label, st.unmoved, st.unmovedGap.Seconds(), st.moved, st.movedGap.Seconds(), st.baseline.Seconds(),
		g1-g0, g0, g1, st.settled.Seconds(), ok, st.unmovedParts, loadavg())
}

// measure computes an event's figures over [t0, tEnd].
func (r *run) measure(t0, tEnd time.Time) eventStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, z, base := t0.UnixNano(), tEnd.UnixNano(), t0.Add(-baselineFor).UnixNano()
	var st eventStats
	for p := range partitions {
		rs := slices.Clone(r.parts[p])
		slices.SortFunc(rs, func(x, y receipt) int { return cmp.Compare(x.at, y.at) })
		var gap, baseGap time.Duration
		procs := map[int]bool{}
		var prev *receipt
		for i := range rs {
			c := &rs[i]
			if c.at > z {
				break
			}
			if c.at >= a {
				procs[c.proc] = true
			}
			if prev != nil {
				d := time.Duration(c.at - prev.at)
				if c.at > a && prev.at < z {
					gap = max(gap, d)
				}
				if c.at > base && c.at <= a {
					baseGap = max(baseGap, d)
				}
			}
			prev = c
		}
		if prev != nil && prev.at < z {
			gap = max(gap, time.Duration(z-max(prev.at, a)))
		}
		st.baseline = max(st.baseline, baseGap)
		// Unmoved: one worker, alive before the event and still, consumed
		// all of the partition's window, and it consumed it before too.
		unmoved := false
		if len(procs) == 1 {
			for w := range procs {
				unmoved = r.ownedBefore(p, w, a) && r.procAlive(w)
			}
		}
		if unmoved {
			st.unmoved++
			st.unmovedGap = max(st.unmovedGap, gap)
			st.unmovedParts = append(st.unmovedParts, p)
		} else {
			st.moved++
			st.movedGap = max(st.movedGap, gap)
			st.movedPart = append(st.movedPart, p)
		}
	}
	return st
}

// ownedBefore says whether w received p's last message before a.
func (r *run) ownedBefore(p, w int, a int64) bool {
	var at int64
	who := -1
	for _, c := range r.parts[p] {
		if c.at < a && c.at > at {
			at, who = c.at, c.proc
		}
	}
	return who == w
}

func (r *run) procAlive(i int) bool {
	select {
	case <-r.procs[i].exited:
		return false
	default:
		return true
	}
}

// stop stops worker i with SIGTERM and waits for it to exit.
func (r *run) stop(i int) {
	r.mu.Lock()
	p := r.procs[i]
	r.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		r.b.Errorf("%s %s: worker %s did not exit within a minute of SIGTERM; killing it", r.mode, r.sc, p.name)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func (r *run) kill(i int) {
	r.mu.Lock()
	p := r.procs[i]
	r.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.exited
}

func (r *run) scenario() {
	switch r.sc {
	case "join":
		w1, w2 := r.start("w1"), r.start("w2")
		r.event("1/1", []int{w1, w2}, nil, func() []int {
			return []int{w1, w2, r.start("w3")}
		})
	case "restart":
		ws := []int{r.start("w1"), r.start("w2"), r.start("w3")}
		for k := range ws {
			r.event(fmt.Sprintf("%d/3", k+1), slices.Clone(ws), nil, func() []int {
				r.stop(ws[k])
				ws[k] = r.start(fmt.Sprintf("w%d", k+1))
				return slices.Clone(ws)
			})
		}
	case "kill", "kill-restart":
		w1, w2, w3 := r.start("w1"), r.start("w2"), r.start("w3")
		r.event("1/1", []int{w1, w2, w3}, nil, func() []int {
			r.kill(w3)
			if r.sc == "kill" {
				return []int{w1, w2}
			}
			return []int{w1, w2, r.start("w3")}
		})
	}
	r.report()
}

// report prints the scenario's line (the worst of its events) and reports
// its metrics.
func (r *run) report() {
	var unmoved, moved, rebal []string
	var ug, mg, bg, settled time.Duration
	steady := true
	for _, s := range r.stats {
		unmoved = append(unmoved, strconv.Itoa(s.unmoved))
		moved = append(moved, strconv.Itoa(s.moved))
		rebal = append(rebal, strconv.Itoa(int(s.genAfter-s.genBefore)))
		ug, mg, bg, settled = max(ug, s.unmovedGap), max(mg, s.movedGap), max(bg, s.baseline), max(settled, s.settled)
		steady = steady && s.steady
	}
	fmt.Printf("rebalance: mode=%s scenario=%s unmoved=%s unmoved_max_gap=%.2fs moved=%s moved_max_gap=%.2fs baseline_gap=%.2fs rebalances=%s settled=%.1fs steady=%v\n",
		r.mode, r.sc, strings.Join(unmoved, "+"), ug.Seconds(), strings.Join(moved, "+"), mg.Seconds(), bg.Seconds(),
		strings.Join(rebal, "+"), settled.Seconds(), steady)
	r.b.ReportMetric(ug.Seconds(), "unmoved_max_gap_s")
	r.b.ReportMetric(mg.Seconds(), "moved_max_gap_s")
	r.b.ReportMetric(bg.Seconds(), "baseline_gap_s")
}

// close kills the workers left, stops the producer, checks the group's
// protocol (KIP-848) and deletes the topic.
func (r *run) close() {
	if r.mode == modeKIP848 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ds, err := r.adm.DescribeConsumerGroups(ctx, r.group)
		cancel()
		if err != nil || ds[r.group].Err != nil {
			fmt.Printf("rebalance: mode=%s scenario=%s: the group is not a KIP-848 consumer group: %v %v\n", r.mode, r.sc, err, ds[r.group].Err)
		} else {
			d := ds[r.group]
			fmt.Printf("rebalance: mode=%s scenario=%s group=%s state=%s epoch=%d assignor=%s members=%d\n", r.mode, r.sc, r.group, d.State, d.Epoch, d.AssignorName, len(d.Members))
		}
	}
	r.mu.Lock()
	procs := slices.Clone(r.procs)
	r.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	r.writeReceipts()
	produced, failed := r.stopProduce()
	if failed > 0 {
		r.b.Logf("%s %s: %d records produced, %d failed", r.mode, r.sc, produced, failed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = r.adm.DeleteTopics(ctx, r.topic)
	r.admCl.Close()
}

// note appends a line to the run's events file.
func (r *run) note(format string, args ...any) {
	f, err := os.OpenFile(filepath.Join(r.logs, "events"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

// writeReceipts writes every receipt (partition, offset, unix nanoseconds,
// worker process) to the run's logs when REBALANCEBENCH_RECEIPTS is set.
func (r *run) writeReceipts() {
	if os.Getenv("REBALANCEBENCH_RECEIPTS") == "" {
		return
	}
	f, err := os.Create(filepath.Join(r.logs, "receipts"))
	if err != nil {
		return
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range partitions {
		for _, c := range r.parts[p] {
			fmt.Fprintf(w, "%d %d %d %s.%d\n", p, c.offset, c.at, r.procs[c.proc].name, c.proc)
		}
	}
}

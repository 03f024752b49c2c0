package chaos

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/systest/pgcluster"
)

// The bad network: with a net-* kind in the run, every connection of the
// workers (to each Postgres server and to each Kafka node) goes through a
// toxiproxy proxy of the suite's own, in process; the producers, the
// monitor and the audit connect directly. The Kafka nodes advertise the
// proxies on a listener of their own (scripts/kafka.sh's
// KAFKA_CLUSTER_PROXIED_PORTS), so the clients that bootstrap through a
// proxy are sent to the proxies for every node, while the nodes replicate
// among themselves directly.
//
//   - net-latency: every answer delayed by 300–1000 ms (jitter half of it)
//     for 15 s, on every proxy.
//   - net-reset-commit: for 15 s, a quarter of the answers to a Postgres
//     COMMIT are dropped and the connection reset (SO_LINGER 0), after the
//     server committed; one Kafka answer in 200 is cut the same way.
//   - net-half-open: for 10 s every connection (open or new) drops every
//     byte both ways and closes nothing, like a peer gone behind a
//     firewall; the connections that lived through it stay so for good, so
//     only a client that gives up on them recovers; new ones work again.

// netFaultKinds are the network's fault kinds.
var netFaultKinds = []string{"net-latency", "net-reset-commit", "net-half-open"}

// usesNet reports whether the topology run puts the proxies between the
// workers and the servers.
func (tp *topology) usesNet() bool {
	if tp == nil {
		return false
	}
	for _, k := range tp.kinds {
		if strings.HasPrefix(k, "net-") {
			return true
		}
	}
	return false
}

// netState is what the toxics of one set of proxies read: the faults
// switched on and off by the run.
type netState struct {
	mu       sync.Mutex
	rnd      *rand.Rand
	holeOpen bool      // a half-open window is on
	holeEnd  time.Time // the end of the last window: links born before it stay dead
	cutPG    float64   // the share of COMMIT answers cut
	cutKafka float64   // the share of Kafka chunks cut

	pgCuts, kafkaCuts, dropped atomic.Int64
}

var netStates sync.Map // a toxic's Run attribute → *netState

func netStateOf(id string) *netState {
	if s, ok := netStates.Load(id); ok {
		return s.(*netState)
	}
	return &netState{rnd: rand.New(rand.NewPCG(0, 0))} // a toxic of no run: inert
}

// dead reports whether a link born at born is inside a half-open window.
func (s *netState) dead(born time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holeOpen || born.Before(s.holeEnd)
}

func (s *netState) coin(p float64) bool {
	if p <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rnd.Float64() < p
}

// pgCommitComplete is a CommandComplete message with the tag COMMIT: the
// server's answer once a COMMIT is durable.
var pgCommitComplete = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

// cutToxic drops a chunk and closes the link: on a Postgres proxy the
// answer to a COMMIT (Kind "pg"), on a Kafka proxy any chunk (Kind
// "kafka"), each with the run's probability. With the proxies' reset_peer
// toxic of toxicity 0 every connection has SO_LINGER 0, so the close is a
// reset.
type cutToxic struct {
	Run  string `json:"run"`
	Kind string `json:"kind"`
}

func (t *cutToxic) Pipe(stub *toxics.ToxicStub) {
	st := netStateOf(t.Run)
	pipe(stub, func(c *stream.StreamChunk) verdict {
		st.mu.Lock()
		p := st.cutKafka
		if t.Kind == "pg" {
			p = st.cutPG
		}
		st.mu.Unlock()
		if p <= 0 || t.Kind == "pg" && !bytes.Contains(c.Data, pgCommitComplete) || !st.coin(p) {
			return pass
		}
		if t.Kind == "pg" {
			st.pgCuts.Add(1)
		} else {
			st.kafkaCuts.Add(1)
		}
		return cut
	})
}

// verdict is what a toxic does with a chunk.
type verdict int

const (
	pass verdict = iota // on to the next toxic
	drop                // dropped, the link left as it is
	cut                 // dropped, and the link closed
)

// pipe runs a toxic's loop on stub, each chunk as judge says. A cut link
// is drained until its reader ends.
func pipe(stub *toxics.ToxicStub, judge func(*stream.StreamChunk) verdict) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			switch judge(c) {
			case pass:
				stub.Output <- c
			case drop:
			case cut:
				stub.Close()
				for {
					select {
					case <-stub.Interrupt:
						return
					case c := <-stub.Input:
						if c == nil {
							return
						}
					}
				}
			}
		}
	}
}

// holeToxic drops every chunk of a link that lived through a half-open
// window, for the link's life.
type holeToxic struct {
	Run string `json:"run"`
}

type holeLink struct{ born time.Time }

func (t *holeToxic) NewState() interface{} { return &holeLink{born: time.Now()} }

func (t *holeToxic) Pipe(stub *toxics.ToxicStub) {
	st := netStateOf(t.Run)
	link, _ := stub.State.(*holeLink)
	if link == nil {
		link = &holeLink{born: time.Now()}
	}
	pipe(stub, func(*stream.StreamChunk) verdict {
		if st.dead(link.born) {
			st.dropped.Add(1)
			return drop
		}
		return pass
	})
}

func init() {
	toxics.Register("exactly_cut", new(cutToxic))
	toxics.Register("exactly_hole", new(holeToxic))
}

// netProxies are the proxies of one run.
type netProxies struct {
	id    string
	st    *netState
	srv   *toxiproxy.ApiServer
	pg    []*toxiproxy.Proxy
	kafka []*toxiproxy.Proxy
	pgMap map[string]string // a Postgres server's address → its proxy's
}

var netRunSeq atomic.Int64

// newNetProxies starts a proxy in front of each Postgres port and one on
// each Kafka node's advertised port to its PROXIED listener.
func newNetProxies(t testing.TB, seed uint64, pgPorts []int, kafkaListen, kafkaUpstream []int) (*netProxies, error) {
	n := &netProxies{id: "run-" + strconv.FormatInt(netRunSeq.Add(1), 10), pgMap: map[string]string{},
		st: &netState{rnd: rand.New(rand.NewPCG(seed, 0x6e6574))}}
	netStates.Store(n.id, n.st)
	t.Cleanup(func() { netStates.Delete(n.id) })
	n.srv = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	start := func(name, listen, upstream, kind string) (*toxiproxy.Proxy, error) {
		p := toxiproxy.NewProxy(n.srv, name, listen, upstream)
		if err := p.Start(); err != nil {
			return nil, fmt.Errorf("chaos: proxy %s on %s: %w", name, listen, err)
		}
		t.Cleanup(p.Stop)
		for _, js := range []string{
			`{"name":"linger_up","type":"reset_peer","stream":"upstream","toxicity":0}`,
			`{"name":"linger_down","type":"reset_peer","stream":"downstream","toxicity":0}`,
			fmt.Sprintf(`{"name":"hole_up","type":"exactly_hole","stream":"upstream","attributes":{"run":%q}}`, n.id),
			fmt.Sprintf(`{"name":"hole_down","type":"exactly_hole","stream":"downstream","attributes":{"run":%q}}`, n.id),
			fmt.Sprintf(`{"name":"cut","type":"exactly_cut","stream":"downstream","attributes":{"run":%q,"kind":%q}}`, n.id, kind),
		} {
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return nil, fmt.Errorf("chaos: proxy %s: toxic %s: %w", name, js, err)
			}
		}
		return p, nil
	}
	for i, port := range pgPorts {
		lp, err := pgcluster.FreePort()
		if err != nil {
			return nil, err
		}
		up, listen := "127.0.0.1:"+strconv.Itoa(port), "127.0.0.1:"+strconv.Itoa(lp)
		p, err := start(fmt.Sprintf("postgres-%d", i+1), listen, up, "pg")
		if err != nil {
			return nil, err
		}
		n.pg = append(n.pg, p)
		n.pgMap[up] = listen
	}
	for i := range kafkaListen {
		p, err := start(fmt.Sprintf("kafka-%d", i+1), "127.0.0.1:"+strconv.Itoa(kafkaListen[i]), "127.0.0.1:"+strconv.Itoa(kafkaUpstream[i]), "kafka")
		if err != nil {
			return nil, err
		}
		n.kafka = append(n.kafka, p)
	}
	return n, nil
}

// url rewrites a connection string (one host or several) so that each
// host goes through its proxy.
func (n *netProxies) url(u string) string {
	for up, p := range n.pgMap {
		u = strings.ReplaceAll(u, up+",", p+",")
		u = strings.ReplaceAll(u, up+"/", p+"/")
	}
	return u
}

func (n *netProxies) brokers() []string {
	var out []string
	for _, p := range n.kafka {
		out = append(out, p.Listen)
	}
	return out
}

func (n *netProxies) all() []*toxiproxy.Proxy {
	return append(append([]*toxiproxy.Proxy(nil), n.pg...), n.kafka...)
}

// latency adds (ms > 0) or removes (ms == 0) a delay on every answer.
func (n *netProxies) latency(ms, jitter int) error {
	for _, p := range n.all() {
		if ms == 0 {
			if err := p.Toxics.RemoveToxic(context.Background(), "spike"); err != nil {
				return fmt.Errorf("chaos: proxy %s: remove the latency: %w", p.Name, err)
			}
			continue
		}
		js := fmt.Sprintf(`{"name":"spike","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, ms, jitter)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("chaos: proxy %s: latency: %w", p.Name, err)
		}
	}
	return nil
}

func (n *netProxies) cuts(pg, kafka float64) {
	n.st.mu.Lock()
	defer n.st.mu.Unlock()
	n.st.cutPG, n.st.cutKafka = pg, kafka
}

func (n *netProxies) hole(open bool) {
	n.st.mu.Lock()
	defer n.st.mu.Unlock()
	n.st.holeOpen = open
	if !open {
		n.st.holeEnd = time.Now()
	}
}

// keyCount is the number of keys the workers have claimed, read directly.
func (c *chaosRun) keyCount(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int64
	err := c.pool.QueryRow(ctx, `SELECT count(*) FROM ledger.exactly_keys2`).Scan(&n)
	if c.o.keyLayout == "single-table" {
		err = c.pool.QueryRow(ctx, `SELECT count(*) FROM ledger.exactly_keys`).Scan(&n)
	}
	return n, err
}

// netFault injects one fault of the network, after a batch of commands so
// that partitions have work; the recovery is the time from the fault's
// start until every partition that had work is committed past where it
// was, and the fault fails when that takes over two minutes past its end.
// Each kind checks that it reached the workers: COMMIT answers were cut,
// and nothing was committed (to Kafka or Postgres) while the network was
// half-open.
func (r *topoRun) netFault(ctx context.Context, c *chaosRun, kind string) {
	start := time.Now()
	if r.net == nil {
		c.t.Errorf("chaos: %s without the proxies", kind)
		return
	}
	if err := r.waitReplicated(ctx, 3*time.Minute); err != nil {
		c.t.Error(err)
		return
	}
	if _, ok := r.workBatch(ctx, c, "before "+kind); !ok {
		return
	}
	base := c.mon.lagging(ctx)
	at := time.Now()
	var dur time.Duration
	var detail string
	ended := make(chan string, 1)
	switch kind {
	case "net-latency":
		dur = 15 * time.Second
		ms := 300 + r.rnd.IntN(701)
		if err := r.net.latency(ms, ms/2); err != nil {
			c.t.Error(err)
			return
		}
		detail = fmt.Sprintf("%d±%d ms on every answer for %s", ms, ms/2, dur)
		go func() {
			// The probe: a round trip through a Postgres proxy takes the delay.
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			msg := ""
			t0 := time.Now()
			conn, err := pgx.Connect(pctx, r.net.url(c.pg.URL()))
			if err == nil {
				t1 := time.Now()
				err = conn.Ping(pctx)
				if rt := time.Since(t1); err == nil && rt < time.Duration(ms/2)*time.Millisecond {
					msg = fmt.Sprintf("a round trip through the Postgres proxy took %s under a latency of %d ms", rt, ms)
				}
				_ = conn.Close(context.Background())
			}
			if err != nil {
				msg = fmt.Sprintf("the probe through the Postgres proxy (after %s): %v", time.Since(t0).Round(time.Millisecond), err)
			}
			time.Sleep(time.Until(at.Add(dur)))
			if err := r.net.latency(0, 0); err != nil && msg == "" {
				msg = err.Error()
			}
			ended <- msg
		}()
	case "net-reset-commit":
		dur = 15 * time.Second
		pg0, k0 := r.net.st.pgCuts.Load(), r.net.st.kafkaCuts.Load()
		r.net.cuts(0.25, 0.005)
		go func() {
			time.Sleep(dur)
			r.net.cuts(0, 0)
			pg, k := r.net.st.pgCuts.Load()-pg0, r.net.st.kafkaCuts.Load()-k0
			detail = fmt.Sprintf("%d COMMIT answers and %d Kafka chunks cut in %s", pg, k, dur)
			msg := ""
			if pg == 0 {
				msg = "no COMMIT answer was cut: the workers' Postgres connections do not go through the proxies"
			}
			ended <- msg
		}()
	case "net-half-open":
		dur = 10 * time.Second
		d0 := r.net.st.dropped.Load()
		r.net.hole(true)
		go func() {
			// Nothing reaches a server while the window is open: what was
			// in flight at its start has landed after 3 s, and from then
			// on the group's offsets and the key count stand still.
			time.Sleep(3 * time.Second)
			off0, err0 := kafkaadmin.Committed(ctx, c.mon.kc, group, commandsTopic, c.mon.commandParts())
			keys0, kerr0 := c.keyCount(ctx)
			time.Sleep(time.Until(at.Add(dur - 300*time.Millisecond)))
			off1, err1 := kafkaadmin.Committed(ctx, c.mon.kc, group, commandsTopic, c.mon.commandParts())
			keys1, kerr1 := c.keyCount(ctx)
			time.Sleep(time.Until(at.Add(dur)))
			r.net.hole(false)
			detail = fmt.Sprintf("%s half-open, %d chunks dropped", dur, r.net.st.dropped.Load()-d0)
			var msgs []string
			if err := firstErr(err0, kerr0, err1, kerr1); err != nil {
				msgs = append(msgs, "reading the offsets or keys during the window: "+err.Error())
			} else {
				for p, o := range off1 {
					if o != off0[p] {
						msgs = append(msgs, fmt.Sprintf("partition %d committed %d → %d while the network was half-open", p, off0[p], o))
					}
				}
				if keys1 != keys0 {
					msgs = append(msgs, fmt.Sprintf("%d keys claimed while the network was half-open", keys1-keys0))
				}
			}
			if len(msgs) > 0 {
				msgs = append(msgs, "the workers' connections do not all go through the proxies")
			}
			ended <- strings.Join(msgs, "; ")
		}()
	default:
		c.t.Errorf("chaos: unknown network fault %q", kind)
		return
	}
	d, ok := time.Duration(0), true
	if len(base) > 0 {
		d, ok = c.mon.progressed(ctx, base, at, dur+2*time.Minute)
		if ok {
			r.recovered[kind] = append(r.recovered[kind], d)
		} else {
			r.unrecov[kind]++
			// The network is whole again long before: a group that still
			// does not consume has a worker waiting on a connection that
			// will never answer.
			c.t.Errorf("chaos: %s: the partitions with work were not consumed again within %s of the fault (lagging %v)", kind, dur+2*time.Minute, base)
		}
	}
	if msg := <-ended; msg != "" {
		c.t.Errorf("chaos: %s: %s", kind, msg)
	}
	r.done[kind]++
	rec := "no partition had work"
	switch {
	case len(base) > 0 && ok:
		rec = "consuming again after " + d.Round(100*time.Millisecond).String()
	case len(base) > 0:
		rec = fmt.Sprintf("NOT consuming again within %s", dur+2*time.Minute)
	}
	line := fmt.Sprintf("%s #%d (%d partitions with work): %s, %s, fault took %s", kind, r.done[kind], len(base), detail, rec,
		time.Since(start).Round(100*time.Millisecond))
	r.timeline = append(r.timeline, line)
	c.t.Logf("chaos-topology: %s", line)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

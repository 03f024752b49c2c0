// Package eprom exports the middleware's and the outbox relay's events as
// Prometheus metrics. It is a module of its own, so that importers of the
// core packages never compile Prometheus.
//
// With a worker.Worker, one line installs it whole (the message and relay
// events, and the gauges of its outbox and key table):
//
//	m := eprom.New(nil)
//	if err := m.Register(prometheus.DefaultRegisterer); err != nil { … }
//	w, err := worker.New(pool, &worker.Config{…, Plugins: []worker.Plugin{m}})
//
// Without one, a [Metrics] is both a [consumer.Hooks] and an [outbox.Hooks]:
//
//	m := eprom.New(nil)
//	if err := m.Register(prometheus.DefaultRegisterer); err != nil { … }
//	dedup, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Hooks: m})
//	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Hooks: m})
//	m.WatchOutbox(relay) // optional gauges, read at scrape
//	m.WatchKeys(store)
//
// The metrics, with Config.Namespace "exactly" (the default):
//
//	exactly_messages_total{scope,topic,outcome}            counter: messages, by consumer.Outcome
//	exactly_message_duration_seconds{scope,outcome}        histogram: claim, handler and commit
//	exactly_dead_lettered_total{scope,topic}               counter: permanent errors (dedupe.IsPermanent), for the dead-letter topic
//	exactly_outbox_batches_total                           counter: relay batches marked
//	exactly_outbox_published_total                         counter: messages published and marked
//	exactly_outbox_publish_failures_total                  counter: publish failures (retried)
//	exactly_outbox_dead_total                              counter: messages moved to DEAD
//	exactly_outbox_batch_size                              histogram: messages published per batch
//	exactly_outbox_publish_lag_seconds                     histogram: age of a batch's oldest message when published
//	exactly_outbox_pending                                 gauge, read at scrape (WatchOutbox): messages waiting
//	exactly_outbox_dead                                    gauge, read at scrape (WatchOutbox): messages in DEAD
//	exactly_outbox_oldest_pending_seconds                  gauge, read at scrape (WatchOutbox): age of the oldest waiting message
//	exactly_keys{status}                                   gauge, read at scrape (WatchKeys)  : keys by status (processing, completed, expired)
//	exactly_keys_table_bytes                               gauge, read at scrape (WatchKeys)  : the key table's size on disk
//	exactly_partition_lag{topic,partition}                 gauge, read at scrape (WatchOffsets): records not yet applied
//	exactly_position_gap{topic,partition}                  gauge, read at scrape (WatchOffsets): database position minus Kafka's committed offset
//	exactly_stats_errors_total{source}                     counter: scrapes whose stats query failed
//
// The gauges read at scrape query Postgres (one statement each, bounded by
// Config.StatsTimeout); without [Metrics.WatchOutbox] and [Metrics.WatchKeys]
// scrapes stay off the database.
//
// The repository's docs/grafana/exactly.json is a Grafana dashboard of these
// metrics (default namespace), and docs/metrics.md says what each one means.
package eprom

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/worker"
)

// OutboxStats reads an outbox's counts; [outbox.Relay] implements it.
type OutboxStats interface {
	Stats(ctx context.Context) (outbox.Stats, error)
}

// KeyStats reads a key table's counts; [dedupe.Store] implementations
// (pgstore.Store) implement it.
type KeyStats interface {
	Stats(ctx context.Context) (dedupe.Stats, error)
}

// Config configures [New]. The zero value (or nil) is ready to use.
type Config struct {
	// Namespace prefixes every metric name. Defaults to "exactly".
	Namespace string
	// ConstLabels are added to every metric (a service name, say).
	// Defaults to none.
	ConstLabels prometheus.Labels
	// Buckets are the message duration histogram's buckets, in seconds.
	// Defaults to prometheus.ExponentialBuckets(0.0005, 2, 16) (0.5 ms to 16 s).
	Buckets []float64
	// StatsTimeout bounds each stats query of a scrape. Defaults to 5s.
	StatsTimeout time.Duration
}

// Metrics turns hook events into Prometheus metrics. It implements
// [consumer.Hooks], [outbox.Hooks] and [prometheus.Collector]; it is safe
// for concurrent use.
type Metrics struct {
	cfg Config

	mu      sync.Mutex
	outbox  OutboxStats
	keys    KeyStats
	offsets func(context.Context) ([]worker.PartitionOffsets, error)

	messages     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	deadLettered *prometheus.CounterVec

	batches       prometheus.Counter
	published     prometheus.Counter
	publishFailed prometheus.Counter
	unavailable   prometheus.Counter
	dead          prometheus.Counter
	batchSize     prometheus.Histogram
	publishLag    prometheus.Histogram

	statsErrors *prometheus.CounterVec
	pendingDesc *prometheus.Desc
	deadDesc    *prometheus.Desc
	oldestDesc  *prometheus.Desc
	keysDesc    *prometheus.Desc
	bytesDesc   *prometheus.Desc
	lagDesc     *prometheus.Desc
	gapDesc     *prometheus.Desc
}

var (
	_ consumer.Hooks       = (*Metrics)(nil)
	_ outbox.Hooks         = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns Metrics; register them with [Metrics.Register]. cfg may be nil.
func New(cfg *Config) *Metrics {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Namespace == "" {
		c.Namespace = "exactly"
	}
	if len(c.Buckets) == 0 {
		c.Buckets = prometheus.ExponentialBuckets(0.0005, 2, 16)
	}
	if c.StatsTimeout <= 0 {
		c.StatsTimeout = 5 * time.Second
	}
	ns, cl := c.Namespace, c.ConstLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, cl)
	}
	return &Metrics{
		cfg: c,
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_total", ConstLabels: cl,
			Help: "Messages handled by the dedupe middleware, by scope, topic and outcome."},
			[]string{"scope", "topic", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "message_duration_seconds", ConstLabels: cl,
			Help: "Claim, handler and commit of one message, by scope and outcome.", Buckets: c.Buckets},
			[]string{"scope", "outcome"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dead_lettered_total", ConstLabels: cl,
			Help: "Messages that failed with a permanent error (dedupe.IsPermanent), for the dead-letter topic."},
			[]string{"scope", "topic"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "outbox_batches_total", ConstLabels: cl,
			Help: "Outbox relay batches marked."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "outbox_published_total", ConstLabels: cl,
			Help: "Outbox messages published and marked."}),
		publishFailed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "outbox_publish_failures_total", ConstLabels: cl,
			Help: "Outbox publish failures (the messages are retried)."}),
		unavailable: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "outbox_publish_unavailable_total", ConstLabels: cl,
			Help: "Outbox publish failures of the infrastructure: a topic that does not exist, a broker out of reach (retried, never DEAD)."}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "outbox_dead_total", ConstLabels: cl,
			Help: "Outbox messages moved to DEAD."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "outbox_batch_size", ConstLabels: cl,
			Help: "Messages published per relay batch.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		publishLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "outbox_publish_lag_seconds", ConstLabels: cl,
			Help: "Age of a batch's oldest message when it was published.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		statsErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stats_errors_total", ConstLabels: cl,
			Help: "Scrapes whose stats query failed, by source (outbox, keys, offsets)."}, []string{"source"}),
		pendingDesc: desc("outbox_pending", "Outbox messages waiting to be published."),
		deadDesc:    desc("outbox_dead", "Outbox messages in DEAD."),
		oldestDesc:  desc("outbox_oldest_pending_seconds", "Age of the oldest outbox message waiting; 0 when none."),
		keysDesc:    desc("keys", "Idempotency keys, by status (processing, completed, expired).", "status"),
		bytesDesc:   desc("keys_table_bytes", "Size on disk of the key table and its indexes."),
		lagDesc: desc("partition_lag", "Records of the partition not yet applied: its end minus the lower of the "+
			"group's committed offset in Kafka and its position in the database.", "topic", "partition"),
		gapDesc: desc("position_gap", "The group's position in the database minus its committed offset in Kafka: "+
			"above 0 Kafka's commit is behind (it catches up), below 0 the database lost commits (a restore, a "+
			"failover) and the worker re-applies from its position.", "topic", "partition"),
	}
}

// Register registers m with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return errors.New("eprom: Register: reg is nil: pass prometheus.DefaultRegisterer or a registry of your own")
	}
	return reg.Register(m)
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.messages, m.duration, m.deadLettered, m.batches, m.published, m.publishFailed, m.unavailable,
		m.dead, m.batchSize, m.publishLag, m.statsErrors}
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{m.pendingDesc, m.deadDesc, m.oldestDesc, m.keysDesc, m.bytesDesc, m.lagDesc, m.gapDesc} {
		ch <- d
	}
}

// WatchOutbox makes every scrape read s ([outbox.Relay.Stats]) for the
// outbox_pending, outbox_dead and outbox_oldest_pending_seconds gauges.
func (m *Metrics) WatchOutbox(s OutboxStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.outbox = s
}

// Watch implements worker.WatchPlugin: a Worker with the Metrics in
// Config.Plugins has every scrape read its relay's and its key store's
// stats (WatchOutbox and WatchKeys).
func (m *Metrics) Watch(r worker.Running) {
	if r.Relay != nil {
		m.WatchOutbox(r.Relay)
	}
	if r.Store != nil {
		m.WatchKeys(r.Store)
	}
	if r.Offsets != nil {
		m.WatchOffsets(r.Offsets)
	}
}

// WatchOffsets makes every scrape read f ([worker.Worker.Offsets]) for the
// partition_lag and position_gap gauges.
func (m *Metrics) WatchOffsets(f func(context.Context) ([]worker.PartitionOffsets, error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offsets = f
}

// WatchKeys makes every scrape read s (a [dedupe.Store]'s Stats) for the
// keys and keys_table_bytes gauges.
func (m *Metrics) WatchKeys(s KeyStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys = s
}

// Collect implements [prometheus.Collector]. After [Metrics.WatchOutbox] or
// [Metrics.WatchKeys] it queries their stats.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	ob, keys, offsets := m.outbox, m.keys, m.offsets
	m.mu.Unlock()
	if offsets != nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StatsTimeout)
		parts, err := offsets(ctx)
		cancel()
		if err != nil {
			m.statsErrors.WithLabelValues("offsets").Inc()
		}
		for _, p := range parts {
			part := strconv.Itoa(p.Partition)
			done := p.Committed
			if p.Position >= 0 && (done < 0 || p.Position < done) {
				done = p.Position
			}
			ch <- prometheus.MustNewConstMetric(m.lagDesc, prometheus.GaugeValue, float64(p.End-max(done, 0)), p.Topic, part)
			if p.Position >= 0 && p.Committed >= 0 {
				ch <- prometheus.MustNewConstMetric(m.gapDesc, prometheus.GaugeValue, float64(p.Position-p.Committed), p.Topic, part)
			}
		}
	}
	if ob != nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StatsTimeout)
		st, err := ob.Stats(ctx)
		cancel()
		if err != nil {
			m.statsErrors.WithLabelValues("outbox").Inc()
		} else {
			ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(st.Pending))
			ch <- prometheus.MustNewConstMetric(m.deadDesc, prometheus.GaugeValue, float64(st.Dead))
			ch <- prometheus.MustNewConstMetric(m.oldestDesc, prometheus.GaugeValue, st.Lag.Seconds())
		}
	}
	if keys != nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StatsTimeout)
		st, err := keys.Stats(ctx)
		cancel()
		if err != nil {
			m.statsErrors.WithLabelValues("keys").Inc()
		} else {
			ch <- prometheus.MustNewConstMetric(m.keysDesc, prometheus.GaugeValue, float64(st.Processing), "processing")
			ch <- prometheus.MustNewConstMetric(m.keysDesc, prometheus.GaugeValue, float64(st.Completed), "completed")
			ch <- prometheus.MustNewConstMetric(m.keysDesc, prometheus.GaugeValue, float64(st.Expired), "expired")
			ch <- prometheus.MustNewConstMetric(m.bytesDesc, prometheus.GaugeValue, float64(st.TableBytes))
		}
	}
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// OnMessage implements [consumer.Hooks].
func (m *Metrics) OnMessage(_ context.Context, ev consumer.Event) {
	outcome := string(ev.Outcome)
	m.messages.WithLabelValues(ev.Scope, ev.Topic, outcome).Inc()
	m.duration.WithLabelValues(ev.Scope, outcome).Observe(ev.Duration.Seconds())
	if dedupe.IsPermanent(ev.Err) {
		m.deadLettered.WithLabelValues(ev.Scope, ev.Topic).Inc()
	}
}

// OnBatch implements [outbox.Hooks].
func (m *Metrics) OnBatch(_ context.Context, ev outbox.BatchEvent) {
	m.batches.Inc()
	m.published.Add(float64(ev.Published))
	m.publishFailed.Add(float64(ev.Failed))
	m.unavailable.Add(float64(ev.Unavailable))
	m.dead.Add(float64(ev.Dead))
	if ev.Published > 0 {
		m.batchSize.Observe(float64(ev.Published))
		m.publishLag.Observe(ev.Lag.Seconds())
	}
}

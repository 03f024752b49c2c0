package ledger

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
)

// Metrics adapts the middleware's and the relay's hooks to Prometheus, and
// keeps totals for progress lines and the demo's summary.
type Metrics struct {
	messages     *prometheus.CounterVec
	latency      prometheus.Histogram
	deadLettered prometheus.Counter
	rejected     prometheus.Counter
	published    prometheus.Counter
	outboxLag    prometheus.Gauge

	Applied, Duplicates, KeyReused, DeadLettered, Rejected, Failed, Published atomic.Int64
	// first is when the first message was handled (Unix nanoseconds).
	first atomic.Int64
}

// First returns when the worker handled its first message; zero before.
func (m *Metrics) First() time.Time {
	if n := m.first.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// NewMetrics registers the worker's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "exactly_messages_total",
			Help: "Messages handled by the dedupe middleware, by outcome (applied, duplicate, key_reused, in_flight, invalid_key, skipped, failed)."}, []string{"outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "exactly_handler_seconds",
			Help: "Claim, handler and commit, per message.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Name: "exactly_dead_lettered_total",
			Help: "Messages sent to the dead-letter topic (permanent errors)."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "ledger_rejected_total",
			Help: "Commands rejected by a ledger rule (recorded, emitted as events)."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "exactly_outbox_published_total",
			Help: "Events published by the outbox relay."}),
		outboxLag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "exactly_outbox_lag_seconds",
			Help: "Age of the oldest event in the last published batch."}),
	}
	reg.MustRegister(m.messages, m.latency, m.deadLettered, m.rejected, m.published, m.outboxLag)
	return m
}

// OnMessage implements consumer.Hooks.
func (m *Metrics) OnMessage(_ context.Context, ev consumer.Event) {
	if m.first.Load() == 0 {
		m.first.CompareAndSwap(0, time.Now().Add(-ev.Duration).UnixNano())
	}
	m.messages.WithLabelValues(string(ev.Outcome)).Inc()
	m.latency.Observe(ev.Duration.Seconds())
	switch ev.Outcome {
	case consumer.OutcomeApplied:
		m.Applied.Add(1)
	case consumer.OutcomeDuplicate:
		m.Duplicates.Add(1)
	case consumer.OutcomeKeyReused:
		m.KeyReused.Add(1)
	case consumer.OutcomeFailed:
		m.Failed.Add(1)
	}
	if dedupe.IsPermanent(ev.Err) {
		m.deadLettered.Inc()
		m.DeadLettered.Add(1)
	}
}

// OnBatch implements outbox.Hooks.
func (m *Metrics) OnBatch(_ context.Context, ev outbox.BatchEvent) {
	m.published.Add(float64(ev.Published))
	m.Published.Add(int64(ev.Published))
	m.outboxLag.Set(ev.Lag.Seconds())
}

func (m *Metrics) onRejected() {
	m.rejected.Inc()
	m.Rejected.Add(1)
}

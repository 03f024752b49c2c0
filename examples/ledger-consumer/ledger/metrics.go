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

// Metrics keeps the worker's totals for progress lines and the demo's
// summary, and counts the commands a ledger rule rejected
// (ledger_rejected_total). The Prometheus metrics of the messages, the
// relay, the outbox and the key table are plugin/eprom's, installed as a
// worker plugin (NewWorker), which the Grafana dashboard in docs/ shows.
type Metrics struct {
	rejected prometheus.Counter

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

// NewMetrics registers the ledger's own metric with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "ledger_rejected_total",
			Help: "Commands rejected by a ledger rule (recorded, emitted as events)."}),
	}
	reg.MustRegister(m.rejected)
	return m
}

// OnMessage implements consumer.Hooks.
func (m *Metrics) OnMessage(_ context.Context, ev consumer.Event) {
	if m.first.Load() == 0 {
		m.first.CompareAndSwap(0, time.Now().Add(-ev.Duration).UnixNano())
	}
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
		m.DeadLettered.Add(1)
	}
}

// OnBatch implements outbox.Hooks.
func (m *Metrics) OnBatch(_ context.Context, ev outbox.BatchEvent) {
	m.Published.Add(int64(ev.Published))
}

func (m *Metrics) onRejected() {
	m.rejected.Inc()
	m.Rejected.Add(1)
}

package outbox

import (
	"context"
	"time"
)

// BatchEvent describes one batch of a [Relay], reported once its rows are
// marked.
type BatchEvent struct {
	// Lanes are the lanes the batch read.
	Lanes []int
	// Published counts the messages published and marked.
	Published int
	// Failed counts publish failures in the batch (to be retried).
	Failed int
	// Dead counts messages moved to DEAD in the batch.
	Dead int
	// Unavailable counts the failures of Failed that are the
	// infrastructure's (a topic that does not exist yet, a broker out of
	// reach): retried until they succeed, never moved to DEAD.
	Unavailable int
	// Lag is the age of the oldest message published in the batch.
	Lag time.Duration
}

// Hooks receives relay events, for metrics ([RelayConfig].Hooks);
// github.com/exactly-go/exactly/plugin/eprom adapts it to Prometheus.
type Hooks interface {
	OnBatch(ctx context.Context, ev BatchEvent)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, ev BatchEvent)

// OnBatch calls f.
func (f HooksFunc) OnBatch(ctx context.Context, ev BatchEvent) { f(ctx, ev) }

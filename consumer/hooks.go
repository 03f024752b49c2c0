package consumer

import (
	"context"
	"time"
)

// Outcome is what the middleware did with one message.
type Outcome string

const (
	// OutcomeApplied: the handler ran and its transaction committed.
	OutcomeApplied Outcome = "applied"
	// OutcomeDuplicate: the key was already completed; the handler did not
	// run and the stored outputs were returned.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeKeyReused: same key, different payload; not applied.
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeInFlight: another worker holds the key's lease (lease mode).
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeInvalidKey: the key was missing or invalid and rejected.
	OutcomeInvalidKey Outcome = "invalid_key"
	// OutcomeSkipped: no valid key; the handler ran unprotected (policy Skip).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeFailed: the handler or the database failed; rolled back.
	OutcomeFailed Outcome = "failed"
)

// Event describes one message handled by the middleware.
type Event struct {
	Scope string
	// Key is the idempotency key; empty when there was none.
	Key     string
	Outcome Outcome
	// Duration covers the claim, the handler and the commit.
	Duration time.Duration
	// Attempts is the key's claim count (lease takeovers add to it).
	Attempts int
	// Topic, Partition and Offset locate the message when it came from
	// this package's Subscriber; Offset is -1 otherwise.
	Topic     string
	Partition int32
	Offset    int64
	// Err is the error returned to the router, if any.
	Err error
}

// Hooks receives an Event per message, for metrics and tracing. OnMessage
// runs on the handler's goroutine after the transaction ended: keep it fast.
// See examples/ledger-consumer for a Prometheus adapter.
type Hooks interface {
	OnMessage(ctx context.Context, ev Event)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, ev Event)

// OnMessage calls f.
func (f HooksFunc) OnMessage(ctx context.Context, ev Event) { f(ctx, ev) }

package consumer

import (
	"context"
	"time"
)

// Outcome is what the middleware did with one message.
type Outcome string

const (
	// OutcomeApplied: the handler ran and its transaction committed (also
	// when the commit's answer was lost and the store found the write).
	OutcomeApplied Outcome = "applied"
	// OutcomeDuplicate: the key was already completed; the handler did not
	// run and the stored outputs were returned.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeKeyReused: same key, different payload; not applied, for the
	// dead-letter topic.
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeInFlight: another worker holds the key's lease (lease mode).
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeInvalidKey: the key was missing or invalid and rejected, for
	// the dead-letter topic.
	OutcomeInvalidKey Outcome = "invalid_key"
	// OutcomeInvalidPayload: the payload could not be fingerprinted (not
	// JSON for dedupe.JSONFingerprint); not applied, for the dead-letter topic.
	OutcomeInvalidPayload Outcome = "invalid_payload"
	// OutcomeResultTooLarge: the handler's outputs are over the store's
	// limit; rolled back, for the dead-letter topic.
	OutcomeResultTooLarge Outcome = "result_too_large"
	// OutcomeRejected: the handler rejected the message with an error
	// marked with dedupe.Permanent (or another permanent error of its
	// own); rolled back, for the dead-letter topic.
	OutcomeRejected Outcome = "rejected"
	// OutcomePoisoned: the message failed because of itself on
	// Config.MaxAttempts attempts; rolled back, for the dead-letter topic.
	OutcomePoisoned Outcome = "poisoned"
	// OutcomeSkipped: no valid key; the handler ran unprotected (policy Skip).
	OutcomeSkipped Outcome = "skipped"
	// OutcomeFailed: the handler failed (counted towards Config.MaxAttempts)
	// or the store failed while the database answered; rolled back and
	// retried.
	OutcomeFailed Outcome = "failed"
	// OutcomeUnavailable: the database (or another dependency whose error
	// the handler marked with dedupe.Retryable) did not answer; rolled back
	// and retried, never dead-lettered.
	OutcomeUnavailable Outcome = "unavailable"
	// OutcomeMisconfigured: the deployment is wrong (a missing table, a
	// scope shared by two handlers, a misordered middleware chain); rolled
	// back and retried, never dead-lettered, until it is fixed. The error
	// says how.
	OutcomeMisconfigured Outcome = "misconfigured"
)

// Event describes one message handled by the middleware.
type Event struct {
	Scope string
	// Key is the idempotency key; empty when there was none.
	Key     string
	Outcome Outcome
	// Duration covers the claim, the handler and the commit.
	Duration time.Duration
	// Attempts is the key's claim count (lease takeovers add to it); see
	// [dedupe.Record].
	Attempts int
	// Topic, Partition and Offset locate the message when it came from
	// the Kafka Subscriber; Offset is -1 otherwise.
	Topic     string
	Partition int32
	Offset    int64
	// Err is the error returned to the router, if any.
	Err error
}

// Hooks receives an [Event] per message, for metrics and tracing. OnMessage
// runs on the handler's goroutine after the transaction ended: keep it fast.
// Its ctx is the message's context as the [Middleware] received it. Modules
// of their own adapt it: github.com/exactly-go/exactly/plugin/eprom to
// Prometheus, github.com/exactly-go/exactly/plugin/eotel to OpenTelemetry.
type Hooks interface {
	OnMessage(ctx context.Context, ev Event)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, ev Event)

// OnMessage calls f.
func (f HooksFunc) OnMessage(ctx context.Context, ev Event) { f(ctx, ev) }

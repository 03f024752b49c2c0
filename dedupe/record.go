package dedupe

import (
	"fmt"
	"time"
)

// Status is the state of a stored key.
type Status string

const (
	// StatusProcessing: claimed under a lease (lease mode), not yet completed.
	StatusProcessing Status = "PROCESSING"
	// StatusCompleted: applied; every later delivery is a duplicate.
	StatusCompleted Status = "COMPLETED"
)

// Source is where a message came from, recorded with its key for audits and
// replays. The zero Source means "unknown".
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Record is a stored key.
type Record struct {
	Key         Key
	Fingerprint Fingerprint
	Status      Status
	// Result is what the first successful run stored for duplicates to get
	// back; nil when it stored nothing.
	Result []byte
	// Attempts counts claims of the key: 1, plus one per lease takeover.
	Attempts    int
	Source      Source
	CreatedAt   time.Time
	CompletedAt time.Time // zero while processing
	LockedUntil time.Time // lease mode only; zero otherwise
	ExpiresAt   time.Time
}

// Decision is what a claim decided.
type Decision int

const (
	// DecisionNew: the key was not known; run the handler.
	DecisionNew Decision = iota + 1
	// DecisionTakeover: the key's lease had expired (a worker crashed or
	// released it); it is claimed again with Attempts+1; run the handler.
	DecisionTakeover
	// DecisionDuplicate: the key was completed with the same fingerprint;
	// do not run the handler; hand back the stored result.
	DecisionDuplicate
)

func (d Decision) String() string {
	switch d {
	case DecisionNew:
		return "new"
	case DecisionTakeover:
		return "takeover"
	case DecisionDuplicate:
		return "duplicate"
	}
	return fmt.Sprintf("Decision(%d)", int(d))
}

// Run reports whether the handler must run on this decision.
func (d Decision) Run() bool { return d == DecisionNew || d == DecisionTakeover }

// Decide is the protocol's decision table for a key that already exists.
// existing is the stored record, fp the fingerprint of the payload that now
// arrived and now the database's clock.
//
//	found                              result
//	COMPLETED, fingerprint equal       DecisionDuplicate
//	any status, fingerprint differs    *KeyReusedError (permanent)
//	PROCESSING, lease valid            *InFlightError (retryable)
//	PROCESSING, lease expired          DecisionTakeover
//
// A fingerprint mismatch wins over every status: a key is bound to the first
// payload that claimed it for as long as its record exists.
func Decide(existing Record, fp Fingerprint, now time.Time) (Decision, error) {
	if existing.Fingerprint != fp {
		return 0, &KeyReusedError{Key: existing.Key, Stored: existing.Fingerprint, Got: fp}
	}
	switch existing.Status {
	case StatusCompleted:
		return DecisionDuplicate, nil
	case StatusProcessing:
		if now.Before(existing.LockedUntil) {
			return 0, &InFlightError{Key: existing.Key, LockedUntil: existing.LockedUntil, Attempts: existing.Attempts}
		}
		return DecisionTakeover, nil
	}
	return 0, fmt.Errorf("dedupe: key %s has unknown status %q", existing.Key, existing.Status)
}

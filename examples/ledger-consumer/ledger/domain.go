// Package ledger is the reference workload of exactly: a ledger worker that
// consumes commands (top up, hold, capture, release, refund) from Kafka and
// applies each exactly once to account balances in Postgres.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/exactly-go/exactly/dedupe"
)

// Command types.
const (
	Topup   = "topup"
	Hold    = "hold"
	Capture = "capture"
	Release = "release"
	Refund  = "refund"
)

// Command is a ledger command as it travels on Kafka (JSON). CommandID is
// the message UUID, so it is the idempotency key.
type Command struct {
	CommandID string `json:"command_id"`
	Type      string `json:"type"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
	// HoldID names the hold that Hold creates and Capture, Release and
	// Refund act on.
	HoldID string `json:"hold_id,omitempty"`
}

// ErrMalformed marks a payload that is not a valid command. It wraps
// dedupe.ErrInvalidPayload, so it is permanent: the message goes to the
// dead-letter topic instead of being retried forever.
var ErrMalformed = fmt.Errorf("ledger: malformed command: %w", dedupe.ErrInvalidPayload)

// Parse decodes and validates a command.
func Parse(payload []byte) (Command, error) {
	var c Command
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	var problems []string
	if c.CommandID == "" {
		problems = append(problems, "command_id is empty")
	}
	if c.Account == "" {
		problems = append(problems, "account is empty")
	}
	if c.Amount <= 0 {
		problems = append(problems, "amount must be positive")
	}
	switch c.Type {
	case Topup:
	case Hold, Capture, Release, Refund:
		if c.HoldID == "" {
			problems = append(problems, c.Type+" needs hold_id")
		}
	default:
		problems = append(problems, fmt.Sprintf("unknown type %q", c.Type))
	}
	if len(problems) > 0 {
		return c, fmt.Errorf("%w: %s", ErrMalformed, strings.Join(problems, "; "))
	}
	return c, nil
}

// Account is an account's balances.
type Account struct {
	Available, Held int64
}

// HoldState is a hold's amounts.
type HoldState struct {
	Account                              string
	Amount, Captured, Released, Refunded int64
}

// Remaining is what can still be captured or released.
func (h HoldState) Remaining() int64 { return h.Amount - h.Captured - h.Released }

// Rejection is a business rule violation: recorded and emitted as an event,
// never retried.
type Rejection struct{ Reason string }

func (r *Rejection) Error() string { return "rejected: " + r.Reason }

// State is what a command reads and changes. The worker implements it on a
// Postgres transaction; Verify on memory.
//
// An implementation must make Apply correct when several commands of one
// account run at once (their records on different partitions): Account
// holds the account against every other command until the command ends,
// whether or not the account existed; Hold does the same for an existing
// hold; CreateHold creates a hold only when no command has created it,
// atomically.
type State interface {
	// Account reads an account (zero when new) and holds it.
	Account(id string) (Account, error)
	// SetAccount writes an account read by Account.
	SetAccount(id string, a Account) error
	// Hold reads and holds a hold; false when it does not exist.
	Hold(id string) (HoldState, bool, error)
	// CreateHold creates a hold; false when it already exists.
	CreateHold(id string, h HoldState) (bool, error)
	// SetHold writes a hold read by Hold.
	SetHold(id string, h HoldState) error
}

// Apply applies c to st under the ledger's rules: the available balance
// never goes negative; capture and release take at most a hold's remaining
// amount; refund gives back at most what was captured. A violation returns
// a *Rejection and changes nothing.
func Apply(st State, c Command) error {
	acc, err := st.Account(c.Account)
	if err != nil {
		return err
	}
	switch c.Type {
	case Topup:
		acc.Available += c.Amount
		return st.SetAccount(c.Account, acc)
	case Hold:
		if _, exists, err := st.Hold(c.HoldID); err != nil {
			return err
		} else if exists {
			return &Rejection{"hold " + c.HoldID + " already exists"}
		}
		if acc.Available < c.Amount {
			return &Rejection{fmt.Sprintf("insufficient funds: available %d, hold %d", acc.Available, c.Amount)}
		}
		acc.Available -= c.Amount
		acc.Held += c.Amount
		if created, err := st.CreateHold(c.HoldID, HoldState{Account: c.Account, Amount: c.Amount}); err != nil {
			return err
		} else if !created { // created meanwhile by a command of another account
			return &Rejection{"hold " + c.HoldID + " already exists"}
		}
		return st.SetAccount(c.Account, acc)
	}
	h, exists, err := st.Hold(c.HoldID)
	if err != nil {
		return err
	}
	if !exists || h.Account != c.Account {
		return &Rejection{"no hold " + c.HoldID + " on account " + c.Account}
	}
	switch c.Type {
	case Capture, Release:
		if c.Amount > h.Remaining() {
			return &Rejection{fmt.Sprintf("%s of %d exceeds the hold's remaining %d", c.Type, c.Amount, h.Remaining())}
		}
		acc.Held -= c.Amount
		if c.Type == Capture {
			h.Captured += c.Amount
		} else {
			h.Released += c.Amount
			acc.Available += c.Amount
		}
	case Refund:
		if c.Amount > h.Captured-h.Refunded {
			return &Rejection{fmt.Sprintf("refund of %d exceeds the captured, unrefunded %d", c.Amount, h.Captured-h.Refunded)}
		}
		h.Refunded += c.Amount
		acc.Available += c.Amount
	}
	if err := st.SetHold(c.HoldID, h); err != nil {
		return err
	}
	return st.SetAccount(c.Account, acc)
}

// IsRejection reports whether err is a business rejection.
func IsRejection(err error) bool {
	var r *Rejection
	return errors.As(err, &r)
}

// MemState is State in memory (for Verify and unit tests).
type MemState struct {
	Accounts map[string]Account
	Holds    map[string]HoldState
}

// NewMemState returns an empty MemState.
func NewMemState() *MemState {
	return &MemState{Accounts: map[string]Account{}, Holds: map[string]HoldState{}}
}

func (m *MemState) Account(id string) (Account, error)    { return m.Accounts[id], nil }
func (m *MemState) SetAccount(id string, a Account) error { m.Accounts[id] = a; return nil }
func (m *MemState) Hold(id string) (HoldState, bool, error) {
	h, ok := m.Holds[id]
	return h, ok, nil
}
func (m *MemState) SetHold(id string, h HoldState) error { m.Holds[id] = h; return nil }
func (m *MemState) CreateHold(id string, h HoldState) (bool, error) {
	if _, ok := m.Holds[id]; ok {
		return false, nil
	}
	m.Holds[id] = h
	return true, nil
}

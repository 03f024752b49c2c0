// Package msgid mints the IDs of the messages that the library creates:
// UUIDv7s, which are time-ordered, so their keys land at the right edge of
// the consumers' key index instead of at a random page of it.
package msgid

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// New returns a new UUIDv7 in its canonical form (36 lowercase characters).
func New() string {
	// NewV7 fails only when the system's random source does, as
	// watermill.NewUUID's uuid.New panics then.
	return uuid.Must(uuid.NewV7()).String()
}

// Fill gives every message of msgs that has no UUID a new one, in place, so
// a retry of the same messages sends the same IDs.
func Fill(msgs []*message.Message) {
	for _, m := range msgs {
		if m != nil && m.UUID == "" {
			m.UUID = New()
		}
	}
}

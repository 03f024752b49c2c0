// Package msgid mints the IDs of the messages that the library creates:
// UUIDv7s, which are time-ordered, so their keys land at the right edge of
// the consumers' key index instead of at a random page of it.
package msgid

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/exactly-go/exactly/dedupe"
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

// DeriveRequest returns the ID of the index-th message of the HTTP request
// whose key, scoped by its principal, is scopedID under scope; key is the
// client's Idempotency-Key: its time bits when it is a UUIDv7 or a ULID,
// else the Unix epoch's (an ID stays the same across re-applications only
// if nothing of the moment goes into it: a key minted ahead of this
// clock gives its time all the same).
func DeriveRequest(scope, scopedID, key string, index int) string {
	at := time.UnixMilli(0)
	if t, err := dedupe.ParseTimeID(key); err == nil && t.Time().UnixMilli() >= 0 {
		at = t.Time()
	}
	id, _ := Derive("http\x00"+scope, scopedID, index, "", at)
	return id
}

// Derive returns the ID of the index-th output of the input message whose
// key is (scope, key): a UUIDv7 that is a pure function of its arguments,
// so that the input applied again (after a restore, say) gives its outputs
// the same IDs and the consumers downstream find them duplicates.
//
// Its 48 time bits are those of input when input is a UUIDv7 (the input's
// own ID), else at's milliseconds (the input record's timestamp); the
// other bits, but the version and the variant, are those of a SHA-256 of
// scope, key and index. With neither (ok false) it returns "": time bits
// taken from the hash would land anywhere in time, and a consumer that
// files keys by their time (the partitioned key layout) refuses an ID far
// in the future.
func Derive(scope, key string, index int, input string, at time.Time) (id string, ok bool) {
	var u uuid.UUID
	if in, err := uuid.Parse(input); err == nil && in.Version() == 7 && in.Variant() == uuid.RFC4122 {
		copy(u[:6], in[:6])
	} else if !at.IsZero() && at.UnixMilli() >= 0 {
		var ms [8]byte
		binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
		copy(u[:6], ms[2:])
	} else {
		return "", false
	}
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(index)))
	copy(u[6:], h.Sum(nil))
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 4122 variant
	return u.String(), true
}

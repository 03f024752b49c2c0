package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactly-go/exactly/dedupe"
)

// The kinds of a stored ID (exactly_keys2.kind).
const (
	kindUUIDv7    = '7' // a UUIDv7, in its time partition
	kindULID      = 'l' // a ULID, in its time partition
	kindOldUUIDv7 = 'o' // a UUIDv7 older than the time partitions, first byte | 0xe0
	kindOldULID   = 'p' // a ULID older than the time partitions, first byte | 0xe0
	kindUUID      = 'u' // any other UUID, bytes 0 and 6 swapped
	kindText      = 't' // anything else: 0xff and 15 bytes of its SHA-256, the ID in id_text
)

// storedID is an ID as the partitioned layout stores it.
type storedID struct {
	kid  [16]byte
	kind byte
	// text is the ID itself, stored for kindText only.
	text *string
	// minted is a time-ordered ID's time, which picks its partition.
	minted time.Time
	timed  bool
}

// encodeID encodes id for the partitioned layout; low is the start of the
// oldest time partition (zero: none yet).
func encodeID(id string, low time.Time) storedID {
	if t, err := dedupe.ParseTimeID(id); err == nil && canonical(t, id) && t.Bytes[0] < 0x10 {
		s := storedID{kid: t.Bytes, kind: kindUUIDv7, minted: t.Time(), timed: true}
		if t.Kind == dedupe.ULID {
			s.kind = kindULID
		}
		if low.IsZero() || s.minted.Before(low) {
			s.kid[0] |= 0xe0
			s.kind, s.timed = map[byte]byte{kindUUIDv7: kindOldUUIDv7, kindULID: kindOldULID}[s.kind], false
		}
		return s
	}
	if u, ok := parseUUID(id); ok && u[6]>>4 != 0 {
		u[0], u[6] = u[6], u[0]
		return storedID{kid: u, kind: kindUUID}
	}
	sum := sha256.Sum256([]byte(id))
	s := storedID{kind: kindText, text: &id}
	s.kid[0] = 0xff
	copy(s.kid[1:], sum[:15])
	return s
}

// canonical reports whether id, which parsed as t, is t's canonical text
// (t.String()): a UUIDv7 in lower case (the test parseUUID makes, which
// allocates nothing for such an ID), a ULID as String writes it.
func canonical(t dedupe.TimeID, id string) bool {
	if t.Kind != dedupe.UUIDv7 {
		return t.String() == id
	}
	return strings.ToLower(id) == id
}

// parseUUID parses a UUID in canonical form (lowercase, hyphenated): only
// that form is stored as 16 bytes, so that the ID is written back exactly.
// kidArg is a kid as a query argument: a pgtype.UUID, whose type pgx knows
// in every QueryExecMode (a [16]byte it encodes only into a parameter whose
// type the server described, which exec and simple_protocol never ask).
func kidArg(kid [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: kid, Valid: true} }

func parseUUID(id string) ([16]byte, bool) {
	var u [16]byte
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' || strings.ToLower(id) != id {
		return u, false
	}
	digits := id[0:8] + id[9:13] + id[14:18] + id[19:23] + id[24:36]
	if _, err := hex.Decode(u[:], []byte(digits)); err != nil {
		return u, false
	}
	return u, true
}

// timeBound is the smallest kid of a time-ordered ID minted at t.
func timeBound(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

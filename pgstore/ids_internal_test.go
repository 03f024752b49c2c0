package pgstore

import (
	"testing"
	"time"
)

// TestEncodeIDKeepsTheTextOfNonCanonicalIDs: a time-ordered ID is stored as
// its 16 bytes only when it is written as ParseTimeID's canonical text
// (lower case for a UUIDv7, upper case for a ULID), since only that text
// comes back from the bytes; any other spelling is kept as text.
func TestEncodeIDKeepsTheTextOfNonCanonicalIDs(t *testing.T) {
	low := time.UnixMilli(1) // every ID here was minted after it
	for _, c := range []struct {
		id   string
		kind byte
	}{
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398f", kindUUIDv7},
		{"017F22E2-79B0-7CC3-98C4-DC0C0C07398F", kindText},
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398F", kindText},
		{"017f22e2-79b0-7Cc3-98c4-dc0c0c07398f", kindText},
		{"01FVYJY2DG0000000000000000", kindULID},
		{"01fvyjy2dg0000000000000000", kindText},
		{"3f0c6b0e-5d4a-4c1e-9a57-2b8f0c1d2e3f", kindUUID},
		{"command-42", kindText},
	} {
		sid := encodeID(c.id, low)
		if sid.kind != c.kind {
			t.Errorf("encodeID(%q): kind %q, want %q", c.id, sid.kind, c.kind)
		}
		if (sid.kind == kindText) != (sid.text != nil && *sid.text == c.id) {
			t.Errorf("encodeID(%q): kind %q with text %v", c.id, sid.kind, sid.text)
		}
	}
}

package dedupe_test

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

func TestParseTimeID(t *testing.T) {
	for _, c := range []struct {
		in, canonical string
		kind          dedupe.TimeIDKind
		ms            int64
	}{
		// RFC 9562, appendix A.6.
		{"017F22E2-79B0-7CC3-98C4-DC0C0C07398F", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f", dedupe.UUIDv7, 1645557742000},
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398f", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f", dedupe.UUIDv7, 1645557742000},
		// The ULID specification's example.
		{"01ARZ3NDEKTSV4RRFFQ69G5FAV", "01ARZ3NDEKTSV4RRFFQ69G5FAV", dedupe.ULID, 1469922850259},
		{"01arz3ndektsv4rrffq69g5fav", "01ARZ3NDEKTSV4RRFFQ69G5FAV", dedupe.ULID, 1469922850259},
		{"7ZZZZZZZZZZZZZZZZZZZZZZZZZ", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ", dedupe.ULID, 1<<48 - 1},
		{"00000000000000000000000000", "00000000000000000000000000", dedupe.ULID, 0},
	} {
		id, err := dedupe.ParseTimeID(c.in)
		if err != nil {
			t.Errorf("ParseTimeID(%q): %v", c.in, err)
			continue
		}
		if id.Kind != c.kind || id.String() != c.canonical || id.Time().UnixMilli() != c.ms {
			t.Errorf("ParseTimeID(%q) = %v %q %d ms, want %v %q %d ms", c.in, id.Kind, id.String(), id.Time().UnixMilli(), c.kind, c.canonical, c.ms)
		}
	}
	for _, bad := range []string{
		"",
		"3f0c6b0e-5d4a-4c1e-9a57-2b8f0c1d2e3f", // version 4
		"017f22e2-79b0-7cc3-08c4-dc0c0c07398f", // variant bits
		"017f22e2x79b0-7cc3-98c4-dc0c0c07398f",
		"017f22e2-79b0-7cc3-98c4-dc0c0c07398g",
		"81ARZ3NDEKTSV4RRFFQ69G5FAV", // over 128 bits
		"01ARZ3NDEKTSV4RRFFQ69G5FAU", // U is not a digit
		"command-42",
	} {
		if _, err := dedupe.ParseTimeID(bad); !errors.Is(err, dedupe.ErrNotTimeOrdered) {
			t.Errorf("ParseTimeID(%q) = %v, want ErrNotTimeOrdered", bad, err)
		}
	}
}

func TestTimeIDOrder(t *testing.T) {
	// Later IDs sort later, as bytes and as text.
	a, _ := dedupe.ParseTimeID("01ARZ3NDEKTSV4RRFFQ69G5FAV")
	b, _ := dedupe.ParseTimeID("01ARZ3NDEMTSV4RRFFQ69G5FAV")
	if !a.Time().Before(b.Time()) || string(a.Bytes[:]) >= string(b.Bytes[:]) || a.String() >= b.String() {
		t.Errorf("%v (%v) should sort before %v (%v)", a, a.Time(), b, b.Time())
	}
	if got := a.Time().UTC().Format(time.RFC3339Nano); got != "2016-07-30T23:54:10.259Z" {
		t.Errorf("Time() = %s", got)
	}
}

// TestParseUUIDv7EveryDigit changes each character of a UUIDv7 in turn to
// every byte, and checks ParseTimeID against encoding/hex on the digits.
func TestParseUUIDv7EveryDigit(t *testing.T) {
	const base = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"
	for i := range len(base) {
		for c := range 256 {
			in := base[:i] + string([]byte{byte(c)}) + base[i+1:]
			got, err := dedupe.ParseTimeID(in)
			digits := strings.ReplaceAll(in, "-", "")
			want, werr := hex.DecodeString(digits)
			hyphens := in[8] == '-' && in[13] == '-' && in[18] == '-' && in[23] == '-'
			ok := hyphens && werr == nil && len(want) == 16 && want[6]>>4 == 7 && want[8]&0xc0 == 0x80
			if ok != (err == nil) {
				t.Fatalf("ParseTimeID(%q) = %v, want ok %v", in, err, ok)
			}
			if ok && string(got.Bytes[:]) != string(want) {
				t.Fatalf("ParseTimeID(%q) = %x, want %x", in, got.Bytes, want)
			}
			if !ok && !errors.Is(err, dedupe.ErrNotTimeOrdered) {
				t.Fatalf("ParseTimeID(%q) = %v, want ErrNotTimeOrdered", in, err)
			}
		}
	}
}

// TestParseUUIDv7NamesTheBadDigit: the error says which character is not a
// hex digit, and where, whichever of a pair it is.
func TestParseUUIDv7NamesTheBadDigit(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"017f22e2-79b0-7cc3-98c4-dc0c0c07398g", `'g' at 35`},
		{"017f22e2-79b0-7cc3-98c4-dc0c0c0739g8", `'g' at 34`},
		{"x17f22e2-79b0-7cc3-98c4-dc0c0c07398f", `'x' at 0`},
		{"017f22e2-79b0-7cc3-98c4-dc0c0c0739gg", `'g' at 34`},
	} {
		_, err := dedupe.ParseTimeID(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseTimeID(%q) = %v, want it to say %s", c.in, err, c.want)
		}
	}
}

package dedupe

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// TimeIDKind says how a time-ordered ID is written.
type TimeIDKind uint8

const (
	// UUIDv7 is an RFC 9562 version 7 UUID, written as 36 lowercase
	// characters (8-4-4-4-12 hex digits).
	UUIDv7 TimeIDKind = iota + 1
	// ULID is a ULID, written as 26 characters of Crockford's base 32,
	// upper case.
	ULID
)

func (k TimeIDKind) String() string {
	switch k {
	case UUIDv7:
		return "uuidv7"
	case ULID:
		return "ulid"
	}
	return fmt.Sprintf("TimeIDKind(%d)", uint8(k))
}

// TimeID is a time-ordered message ID: a UUIDv7 or a ULID. Both are 128
// bits whose first 48 are the Unix time in milliseconds, big-endian, so IDs
// minted later sort later, as bytes and as their canonical text. Keys with
// such IDs land at the right edge of an index, which stays in memory, where
// random IDs (UUIDv4) cost a read of a cold index page each once the key
// table outgrows memory.
type TimeID struct {
	// Bytes are the ID's 128 bits.
	Bytes [16]byte
	// Kind is how the ID is written.
	Kind TimeIDKind
}

// ErrNotTimeOrdered is wrapped by ParseTimeID's error for an ID that is
// not a UUIDv7 or a ULID.
var ErrNotTimeOrdered = errors.New("dedupe: not a time-ordered ID (UUIDv7 or ULID)")

// ParseTimeID parses a UUIDv7 (hex, either case, with hyphens) or a ULID
// (Crockford base 32, either case). Anything else is an error wrapping
// ErrNotTimeOrdered.
func ParseTimeID(id string) (TimeID, error) {
	switch len(id) {
	case 36:
		return parseUUIDv7(id)
	case 26:
		return parseULID(id)
	}
	return TimeID{}, fmt.Errorf("%w: %q is %d characters long, neither a UUID (36) nor a ULID (26)", ErrNotTimeOrdered, id, len(id))
}

func parseUUIDv7(id string) (TimeID, error) {
	if id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return TimeID{}, fmt.Errorf("%w: %q is not a UUID: hyphens expected at 8, 13, 18 and 23", ErrNotTimeOrdered, id)
	}
	var t TimeID
	j := 0
	for i := 0; i < 36; i += 2 {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i-- // the hyphen: the next pair starts after it
			continue
		}
		hi, lo := hexValue[id[i]], hexValue[id[i+1]]
		if hi|lo == 0xff {
			k := i
			if hi != 0xff {
				k++
			}
			return TimeID{}, fmt.Errorf("%w: %q is not a UUID: %q at %d is not a hex digit", ErrNotTimeOrdered, id, id[k], k)
		}
		t.Bytes[j] = hi<<4 | lo
		j++
	}
	if v := t.Bytes[6] >> 4; v != 7 {
		return TimeID{}, fmt.Errorf("%w: %q is a version %d UUID, not version 7", ErrNotTimeOrdered, id, v)
	}
	if t.Bytes[8]&0xc0 != 0x80 {
		return TimeID{}, fmt.Errorf("%w: %q is not an RFC 9562 UUID (variant bits)", ErrNotTimeOrdered, id)
	}
	t.Kind = UUIDv7
	return t, nil
}

// hexValue maps a byte to its value as a hex digit (either case), or 0xff.
var hexValue = func() (m [256]byte) {
	for i := range m {
		m[i] = 0xff
	}
	for i := byte(0); i < 10; i++ {
		m['0'+i] = i
	}
	for i := byte(0); i < 6; i++ {
		m['a'+i], m['A'+i] = 10+i, 10+i
	}
	return m
}()

// crockford maps a byte to its base-32 value, or 0xff.
var crockford = func() (m [256]byte) {
	const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	for i := range m {
		m[i] = 0xff
	}
	for i := 0; i < len(alphabet); i++ {
		m[alphabet[i]] = byte(i)
		m[alphabet[i]|0x20] = byte(i) // lower case
	}
	return m
}()

func parseULID(id string) (TimeID, error) {
	var v [26]byte
	for i := 0; i < 26; i++ {
		if v[i] = crockford[id[i]]; v[i] == 0xff {
			return TimeID{}, fmt.Errorf("%w: %q is not a ULID: %q at %d is not a Crockford base-32 digit", ErrNotTimeOrdered, id, id[i], i)
		}
	}
	if v[0] > 7 {
		return TimeID{}, fmt.Errorf("%w: %q is not a ULID: it overflows 128 bits", ErrNotTimeOrdered, id)
	}
	// 26 digits of 5 bits are 130 bits, the first two of them zero: read
	// them as one big-endian number into 16 bytes.
	var t TimeID
	var acc uint32
	bits, out := 0, 15
	for i := 25; i >= 0; i-- {
		acc |= uint32(v[i]) << bits
		bits += 5
		for bits >= 8 && out >= 0 {
			t.Bytes[out] = byte(acc)
			acc >>= 8
			bits -= 8
			out--
		}
	}
	t.Kind = ULID
	return t, nil
}

// Time is the instant the ID was minted, to the millisecond.
func (t TimeID) Time() time.Time {
	b := t.Bytes
	ms := int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5])
	return time.UnixMilli(ms)
}

// String writes the ID in its canonical form: lowercase for a UUIDv7, upper
// case for a ULID.
func (t TimeID) String() string {
	switch t.Kind {
	case UUIDv7:
		var buf [36]byte
		hex.Encode(buf[0:8], t.Bytes[0:4])
		buf[8] = '-'
		hex.Encode(buf[9:13], t.Bytes[4:6])
		buf[13] = '-'
		hex.Encode(buf[14:18], t.Bytes[6:8])
		buf[18] = '-'
		hex.Encode(buf[19:23], t.Bytes[8:10])
		buf[23] = '-'
		hex.Encode(buf[24:36], t.Bytes[10:16])
		return string(buf[:])
	case ULID:
		const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
		var buf [26]byte
		var acc uint32
		bits, in := 0, 15
		for i := 25; i >= 0; i-- {
			for bits < 5 && in >= 0 {
				acc |= uint32(t.Bytes[in]) << bits
				bits += 8
				in--
			}
			buf[i] = alphabet[acc&31]
			acc >>= 5
			bits -= 5
		}
		return string(buf[:])
	}
	return ""
}

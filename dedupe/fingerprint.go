package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Fingerprint is the lowercase hex SHA-256 of a payload: 64 characters.
// A key stays bound to the fingerprint of the payload that first claimed it;
// a later payload with the same key and another fingerprint is a key reuse.
type Fingerprint string

// FingerprintFunc computes the fingerprint of a payload.
type FingerprintFunc func(payload []byte) (Fingerprint, error)

// FingerprintOf returns the fingerprint of payload's bytes exactly as given.
// The empty payload has a fingerprint too (that of zero bytes).
func FingerprintOf(payload []byte) Fingerprint {
	sum := sha256.Sum256(payload)
	return Fingerprint(hex.EncodeToString(sum[:]))
}

// RawFingerprint is a FingerprintFunc over the payload's raw bytes.
// It never fails.
func RawFingerprint(payload []byte) (Fingerprint, error) { return FingerprintOf(payload), nil }

// JSONFingerprint is a FingerprintFunc over the canonical form of a JSON
// payload (see CanonicalJSON), for producers whose serialisation is not
// stable: {"b":1,"a":2.0} and { "a": 2, "b": 1 } have the same fingerprint.
// It returns an error wrapping ErrInvalidPayload for a payload that is not
// JSON, or whose numbers are over MaxNumberLen or MaxExponent.
//
// A JSON payload with strings that are not valid Unicode (bytes that are
// not UTF-8, or a lone surrogate escape such as "\ud800") has no canonical
// form: every decoder would turn them into U+FFFD and make different
// payloads equal. Such a payload is fingerprinted by its raw bytes, which can
// never equal a canonical form (canonical forms are valid Unicode).
func JSONFingerprint(payload []byte) (Fingerprint, error) {
	if !validUnicode(payload) {
		if !json.Valid(payload) {
			return "", fmt.Errorf("%w: not JSON", ErrInvalidPayload)
		}
		if err := checkDuplicateKeys(payload); err != nil {
			return "", err
		}
		return FingerprintOf(payload), nil
	}
	c, err := CanonicalJSON(payload)
	if err != nil {
		return "", err
	}
	return FingerprintOf(c), nil
}

// Valid reports whether f looks like a fingerprint: 64 lowercase hex digits.
func (f Fingerprint) Valid() bool {
	if len(f) != sha256.Size*2 {
		return false
	}
	for i := 0; i < len(f); i++ {
		c := f[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CanonicalJSON returns payload re-encoded with object keys sorted, no
// insignificant white space, strings in encoding/json's escaping, and numbers
// in one exact decimal form: 1.0, 1e0 and 1 all become 1, 0.10 and 1e-1
// become 0.1, and no digit is ever rounded away (0.1 and
// 0.10000000000000000555 stay different). A number is written in plain
// decimal while that takes at most 64 digits on either side of the point,
// and as d.ddde±n otherwise (1e400 stays 1e400), so a hostile number costs
// no more than its own length.
//
// Errors wrap ErrInvalidPayload: a payload that is not JSON, a duplicated
// object key (which of the two values counts is not defined across JSON
// parsers), a number literal longer than MaxNumberLen bytes or with an
// exponent beyond ±MaxExponent, and strings that are not valid Unicode (see
// JSONFingerprint).
func CanonicalJSON(payload []byte) ([]byte, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, fmt.Errorf("%w: empty payload is not JSON", ErrInvalidPayload)
	}
	if !validUnicode(payload) {
		return nil, fmt.Errorf("%w: a string is not valid Unicode (invalid UTF-8 or a lone surrogate escape)", ErrInvalidPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("%w: data after the JSON value", ErrInvalidPayload)
	}
	if err := checkDuplicateKeys(payload); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(x))
	case string:
		b, err := json.Marshal(x)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidPayload, err)
		}
		buf.Write(b)
	case json.Number:
		s, err := canonicalNumber(string(x))
		if err != nil {
			return err
		}
		buf.WriteString(s)
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := writeCanonical(buf, x[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("%w: unexpected JSON value %T", ErrInvalidPayload, v)
	}
	return nil
}

// Bounds on a JSON number in CanonicalJSON. Past them a payload is invalid
// (ErrInvalidPayload), so that a hostile number can never cost more than a
// bounded amount of work.
const (
	// MaxNumberLen is the longest number literal accepted, in bytes.
	MaxNumberLen = 1024
	// MaxExponent bounds a number's decimal exponent, either sign.
	MaxExponent = 1_000_000_000
)

// plainDigits is how many digits a number may have on either side of the
// point and still be written in plain decimal.
const plainDigits = 64

// canonicalNumber writes the exact decimal value of the JSON number s in
// one form, without ever expanding its exponent: digits d (no leading or
// trailing zeros) times 10^e is written in plain decimal when that needs at
// most plainDigits digits before and after the point, as d.ddde±n otherwise.
func canonicalNumber(s string) (string, error) {
	if len(s) > MaxNumberLen {
		return "", fmt.Errorf("%w: number of %d bytes is over the limit of %d", ErrInvalidPayload, len(s), MaxNumberLen)
	}
	neg := strings.HasPrefix(s, "-")
	rest := strings.TrimPrefix(s, "-")
	mant, expText, hasExp := strings.Cut(strings.ToLower(rest), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	if intPart == "" || !isDigits(intPart) || !isDigits(frac) {
		return "", fmt.Errorf("%w: bad number %q", ErrInvalidPayload, s)
	}
	exp := int64(0)
	if hasExp {
		e, err := strconv.ParseInt(strings.TrimPrefix(expText, "+"), 10, 64)
		if err != nil || expText == "" || expText == "+" || e > MaxExponent || e < -MaxExponent {
			return "", fmt.Errorf("%w: number %q: exponent is not an integer within ±%d", ErrInvalidPayload, s, MaxExponent)
		}
		exp = e
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	exp -= int64(len(frac)) // value = digits × 10^exp
	if digits == "" {
		return "0", nil
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	digits = trimmed
	n := int64(len(digits))
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	switch {
	case exp >= 0 && n+exp <= plainDigits: // an integer
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", int(exp)))
	case exp < 0 && -exp <= plainDigits && n+exp <= plainDigits: // a fraction
		if n+exp > 0 {
			b.WriteString(digits[:n+exp])
			b.WriteByte('.')
			b.WriteString(digits[n+exp:])
		} else {
			b.WriteString("0.")
			b.WriteString(strings.Repeat("0", int(-(n + exp))))
			b.WriteString(digits)
		}
	default:
		b.WriteByte(digits[0])
		if n > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		b.WriteByte('e')
		b.WriteString(strconv.FormatInt(exp+n-1, 10))
	}
	return b.String(), nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validUnicode reports whether payload is valid UTF-8 and has no escape of
// a lone UTF-16 surrogate ("\ud800" not followed by a low surrogate, or a
// low one alone). A backslash appears only inside strings in JSON, so the
// escapes can be found without tracking where strings begin.
func validUnicode(payload []byte) bool {
	if !utf8.Valid(payload) {
		return false
	}
	hex4 := func(i int) (int, bool) {
		if i+6 > len(payload) || payload[i] != '\\' || payload[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(payload[i+2:i+6]), 16, 16)
		return int(v), err == nil
	}
	for i := 0; i < len(payload); i++ {
		if payload[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // another escape: skip the escaped character
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			lo, ok := hex4(i + 6)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return false
		default:
			i += 5
		}
	}
	return true
}

// checkDuplicateKeys walks the token stream and fails on an object that
// names the same key twice.
func checkDuplicateKeys(payload []byte) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	type frame struct {
		keys    map[string]struct{} // nil for an array
		wantKey bool
	}
	var stack []*frame
	// valueDone marks that a value ended inside the innermost container.
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidPayload, err)
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				stack = append(stack, &frame{keys: map[string]struct{}{}, wantKey: true})
			case '[':
				stack = append(stack, &frame{})
			default: // '}' or ']'
				stack = stack[:len(stack)-1]
				valueDone()
			}
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			top := stack[n-1]
			k := tok.(string)
			if _, dup := top.keys[k]; dup {
				return fmt.Errorf("%w: object key %q appears twice", ErrInvalidPayload, k)
			}
			top.keys[k] = struct{}{}
			top.wantKey = false
			continue
		}
		valueDone()
	}
}

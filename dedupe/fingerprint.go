package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strconv"
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
// It returns an error wrapping ErrInvalidPayload for a payload that is not JSON.
func JSONFingerprint(payload []byte) (Fingerprint, error) {
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
// in one form: integers in plain decimal (1.0, 1e0 and 1 all become 1), other
// numbers in the shortest form that round-trips through float64.
// A duplicated object key is an error: which of the two values counts is not
// defined across JSON parsers.
func CanonicalJSON(payload []byte) ([]byte, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, fmt.Errorf("%w: empty payload is not JSON", ErrInvalidPayload)
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

// canonicalNumber writes integers (of any size) in plain decimal and other
// numbers in the shortest float64 form.
func canonicalNumber(s string) (string, error) {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return "", fmt.Errorf("%w: bad number %q", ErrInvalidPayload, s)
	}
	if r.IsInt() {
		return r.Num().String(), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return "", fmt.Errorf("%w: number %q: %v", ErrInvalidPayload, s, err)
	}
	return strconv.FormatFloat(f, 'g', -1, 64), nil
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

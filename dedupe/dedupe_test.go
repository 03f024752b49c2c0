package dedupe_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

func TestDecideTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	key := dedupe.Key{Scope: "s", ID: "id"}
	fp, other := dedupe.FingerprintOf([]byte("a")), dedupe.FingerprintOf([]byte("b"))
	rec := func(st dedupe.Status, f dedupe.Fingerprint, lockedUntil time.Time) dedupe.Record {
		return dedupe.Record{Key: key, Fingerprint: f, Status: st, LockedUntil: lockedUntil, Attempts: 1}
	}
	tests := []struct {
		name    string
		rec     dedupe.Record
		want    dedupe.Decision
		wantErr error
	}{
		{"completed, same fingerprint", rec(dedupe.StatusCompleted, fp, time.Time{}), dedupe.DecisionDuplicate, nil},
		{"completed, other fingerprint", rec(dedupe.StatusCompleted, other, time.Time{}), 0, dedupe.ErrKeyReused},
		{"processing, lease valid", rec(dedupe.StatusProcessing, fp, now.Add(time.Second)), 0, dedupe.ErrInFlight},
		{"processing, lease expired", rec(dedupe.StatusProcessing, fp, now.Add(-time.Second)), dedupe.DecisionTakeover, nil},
		{"processing, lease ends now", rec(dedupe.StatusProcessing, fp, now), dedupe.DecisionTakeover, nil},
		{"processing, other fingerprint", rec(dedupe.StatusProcessing, other, now.Add(time.Hour)), 0, dedupe.ErrKeyReused},
		{"unknown status", rec("FAILED", fp, time.Time{}), 0, errors.New("unknown status")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := dedupe.Decide(tt.rec, fp, now)
			if tt.wantErr == nil {
				if err != nil || got != tt.want {
					t.Fatalf("Decide = %v, %v; want %v", got, err, tt.want)
				}
				return
			}
			if err == nil || (!errors.Is(err, tt.wantErr) && !strings.Contains(err.Error(), tt.wantErr.Error())) {
				t.Fatalf("Decide err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestDecideErrorsCarryData(t *testing.T) {
	now := time.Now()
	key := dedupe.Key{Scope: "s", ID: "id"}
	stored, got := dedupe.FingerprintOf([]byte("a")), dedupe.FingerprintOf([]byte("b"))
	_, err := dedupe.Decide(dedupe.Record{Key: key, Fingerprint: stored, Status: dedupe.StatusCompleted}, got, now)
	var kr *dedupe.KeyReusedError
	if !errors.As(err, &kr) || kr.Stored != stored || kr.Got != got || kr.Key != key {
		t.Fatalf("err = %#v", err)
	}
	until := now.Add(time.Minute)
	_, err = dedupe.Decide(dedupe.Record{Key: key, Fingerprint: stored, Status: dedupe.StatusProcessing, LockedUntil: until, Attempts: 3}, stored, now)
	var inf *dedupe.InFlightError
	if !errors.As(err, &inf) || !inf.LockedUntil.Equal(until) || inf.Attempts != 3 {
		t.Fatalf("err = %#v", err)
	}
}

func TestClassification(t *testing.T) {
	tests := []struct {
		err                  error
		permanent, retryable bool
	}{
		{&dedupe.KeyReusedError{}, true, false},
		{&dedupe.InvalidKeyError{}, true, false},
		{&dedupe.ResultTooLargeError{Size: 2, Limit: 1}, true, false},
		{fmt.Errorf("wrap: %w", dedupe.ErrInvalidPayload), true, false},
		{&dedupe.InFlightError{}, false, true},
		{dedupe.Retryable(errors.New("40001")), false, true},
		{fmt.Errorf("outer: %w", dedupe.Retryable(errors.New("x"))), false, true},
		{dedupe.Permanent(errors.New("amount below zero")), true, false},
		{fmt.Errorf("handler: %w", dedupe.Permanent(errors.New("no such account"))), true, false},
		{dedupe.Permanent(fmt.Errorf("table: %w", dedupe.ErrMisconfigured)), false, false},
		{errors.New("plain"), false, false},
		{nil, false, false},
	}
	for _, tt := range tests {
		if got := dedupe.IsPermanent(tt.err); got != tt.permanent {
			t.Errorf("IsPermanent(%v) = %v", tt.err, got)
		}
		if got := dedupe.IsRetryable(tt.err); got != tt.retryable {
			t.Errorf("IsRetryable(%v) = %v", tt.err, got)
		}
	}
	if dedupe.Retryable(nil) != nil {
		t.Error("Retryable(nil) != nil")
	}
	if dedupe.Permanent(nil) != nil {
		t.Error("Permanent(nil) != nil")
	}
	inner := errors.New("amount below zero")
	if err := dedupe.Permanent(inner); err.Error() != inner.Error() || !errors.Is(err, inner) {
		t.Errorf("Permanent(%v) = %v: want the same text, wrapping it", inner, err)
	}
}

func TestKeyValidate(t *testing.T) {
	ok := []dedupe.Key{
		{"s", "0b9c2b1e-5b8f-4a43-9a0f-6b2f0c1d2e3f"},
		{"ledger-consumer", "topup:42"},
		{"s", strings.Repeat("x", dedupe.MaxKeyLen)},
		{"s", "ünïcødé key with spaces"},
	}
	for _, k := range ok {
		if err := k.Validate(); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	bad := map[string]dedupe.Key{
		"empty id":    {"s", ""},
		"empty scope": {"", "id"},
		"too long":    {"s", strings.Repeat("x", dedupe.MaxKeyLen+1)},
		"newline":     {"s", "a\nb"},
		"nul":         {"s", "a\x00"},
		"del":         {"s", "a\x7f"},
		"c1 control":  {"s", "a\u0085"},
		"invalid":     {"s", "\xc3\x28"},
	}
	for name, k := range bad {
		_, err := dedupe.NewKey(k.Scope, k.ID)
		var ik *dedupe.InvalidKeyError
		if !errors.As(err, &ik) || !errors.Is(err, dedupe.ErrInvalidKey) {
			t.Errorf("%s: err = %v, want *InvalidKeyError", name, err)
		}
	}
}

func TestFingerprint(t *testing.T) {
	// SHA-256 of the empty string and of "abc" (FIPS 180-2 test vectors).
	if got := dedupe.FingerprintOf(nil); got != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("empty: %s", got)
	}
	if got := dedupe.FingerprintOf([]byte("abc")); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("abc: %s", got)
	}
	if !dedupe.FingerprintOf([]byte("x")).Valid() || dedupe.Fingerprint("ABC").Valid() ||
		dedupe.Fingerprint(strings.Repeat("G", 64)).Valid() {
		t.Error("Valid is wrong")
	}
}

func TestCanonicalJSON(t *testing.T) {
	same := [][]string{
		{`{"b":1,"a":2}`, ` { "a" : 2 , "b" : 1 } `, `{"a":2.0,"b":1e0}`, `{"a":20e-1,"b":1.00}`},
		{`[1,{"y":[true,null],"x":"é"}]`, `[1.0, {"x":"\u00e9","y":[true, null]}]`},
		{`12345678901234567890123`, `1.2345678901234567890123e22`},
		{`0.1`, `1e-1`, `0.10`},
		{`-0`, `0`},
	}
	for _, group := range same {
		first, err := dedupe.CanonicalJSON([]byte(group[0]))
		if err != nil {
			t.Fatalf("%s: %v", group[0], err)
		}
		for _, in := range group[1:] {
			got, err := dedupe.CanonicalJSON([]byte(in))
			if err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			if string(got) != string(first) {
				t.Errorf("CanonicalJSON(%s) = %s, want %s", in, got, first)
			}
		}
	}
	got, _ := dedupe.CanonicalJSON([]byte(`{"z":{"b":[1,2],"a":"<&>"},"a":0.5}`))
	if want := `{"a":0.5,"z":{"a":"\u003c\u0026\u003e","b":[1,2]}}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
	different := [][2]string{{`{"a":1}`, `{"a":"1"}`}, {`[1,2]`, `[2,1]`}, {`{"a":1}`, `{"a":1.5}`}}
	for _, d := range different {
		a, _ := dedupe.JSONFingerprint([]byte(d[0]))
		b, _ := dedupe.JSONFingerprint([]byte(d[1]))
		if a == b {
			t.Errorf("%s and %s have the same fingerprint", d[0], d[1])
		}
	}
	for _, in := range []string{``, `   `, `{`, `{"a":1} {"b":2}`, `{"a":1,"a":2}`, `[{"x":{"k":1,"k":1}}]`, `nope`} {
		if _, err := dedupe.JSONFingerprint([]byte(in)); !errors.Is(err, dedupe.ErrInvalidPayload) {
			t.Errorf("JSONFingerprint(%q) err = %v, want ErrInvalidPayload", in, err)
		}
	}
	// The same key in sibling objects is not a duplicate.
	if _, err := dedupe.CanonicalJSON([]byte(`[{"k":1},{"k":2},{"o":{"k":3},"k":4}]`)); err != nil {
		t.Errorf("sibling keys: %v", err)
	}
}

// Hostile numbers cost no more than their length: an exponent is never
// expanded. Past the bounds a number is an invalid payload, never a hang.
func TestCanonicalJSONHostileNumbers(t *testing.T) {
	for in, want := range map[string]string{
		`1e1000000`:   `1e1000000`,
		`-1E+1000000`: `-1e1000000`,
		`1e-1000000`:  `1e-1000000`,
		`10e999999`:   `1e1000000`,
		`1e63`:        `1` + strings.Repeat("0", 63),
		`1e64`:        `1e64`,
		`123.456e-70`: `1.23456e-68`,
		`0.000001`:    `0.000001`,
		`0e99999999`:  `0`,
		`1.5`:         `1.5`,
		`-0.0`:        `0`,
	} {
		got, err := dedupe.CanonicalJSON([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	array := []byte("[" + strings.TrimSuffix(strings.Repeat("1e1000000,", 40), ",") + "]")
	if _, err := dedupe.JSONFingerprint(array); err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{`1e1000000001`, `1e-99999999999999999999`, "[" + strings.Repeat("1", dedupe.MaxNumberLen+1) + "]"} {
		if _, err := dedupe.JSONFingerprint([]byte(in)); !errors.Is(err, dedupe.ErrInvalidPayload) {
			t.Errorf("JSONFingerprint(%.40s…) err = %v, want ErrInvalidPayload", in, err)
		}
	}
}

// Values that differ fingerprint differently: digits past float64's
// precision, and strings that differ only in bytes that are not valid UTF-8
// or in lone surrogate escapes (which decoders all turn into U+FFFD).
func TestJSONFingerprintKeepsValuesApart(t *testing.T) {
	different := [][2]string{
		{`{"amount":0.1}`, `{"amount":0.10000000000000000555}`},
		{`12345678901234567890.5`, `12345678901234567890.50000001`},
		{`1e400`, `1e401`},
		{"\"a\xff\"", "\"a\xfe\""},
		{"\"a\xff\"", "\"a\ufffd\""},
		{`"\ud800"`, `"\udc00"`},
		{`"\ud800"`, `"\ufffd"`},
		{`{"k\ud800":1}`, `{"k\ud801":1}`},
	}
	for _, d := range different {
		a, err := dedupe.JSONFingerprint([]byte(d[0]))
		if err != nil {
			t.Fatalf("%q: %v", d[0], err)
		}
		b, err := dedupe.JSONFingerprint([]byte(d[1]))
		if err != nil {
			t.Fatalf("%q: %v", d[1], err)
		}
		if a == b {
			t.Errorf("%q and %q have the same fingerprint", d[0], d[1])
		}
	}
	// A surrogate pair is one valid character, canonicalised like the raw one.
	a, _ := dedupe.JSONFingerprint([]byte(`{"e":"\ud83d\ude00", "n":1}`))
	b, _ := dedupe.JSONFingerprint([]byte("{\"n\":1,\"e\":\"\U0001F600\"}"))
	if a != b || a == "" {
		t.Errorf("a surrogate pair and its character: %s and %s", a, b)
	}
	for _, in := range []string{"\"\xff", "{\"a\xff\":1,\"a\xff\":2}"} {
		if _, err := dedupe.JSONFingerprint([]byte(in)); !errors.Is(err, dedupe.ErrInvalidPayload) {
			t.Errorf("JSONFingerprint(%q) err = %v, want ErrInvalidPayload", in, err)
		}
	}
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2.5,"x"]}`, `[]`, `"s"`, `1e400`, `{"a":{"a":{}}}`,
		`1e1000000`, `[1e1000000,-1e-1000000,1e1000000001]`, `0.1`, `0.10000000000000000555`,
		"\"a\xff\"", "\"a\xfe\"", `"\ud800"`, `"\udc00\ud800"`, `"\ud83d\ude00"`, `{"a":0.0e-0}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := dedupe.CanonicalJSON(in)
		if err != nil {
			return
		}
		// Canonical form is a fixed point.
		c2, err := dedupe.CanonicalJSON(c)
		if err != nil || string(c2) != string(c) {
			t.Fatalf("not a fixed point: %s -> %s (%v)", c, c2, err)
		}
		// It is the same value for encoding/json.
		var a, b any
		if json.Unmarshal(in, &a) == nil {
			if err := json.Unmarshal(c, &b); err != nil || !reflect.DeepEqual(a, b) {
				t.Fatalf("%q and its canonical form %s differ (%v)", in, c, err)
			}
		}
	})
}

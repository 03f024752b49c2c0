package httpkey

import (
	"errors"
	"fmt"
	"strings"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// ReplayedHeader marks a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

var errNoKey = errors.New("no Idempotency-Key header")

// parseKey reads the key from the header's values: one Structured Field
// String (RFC 9651 §3.3.3), "…" with printable ASCII inside and \" and \\
// as the only escapes, of 1 to max characters; with bare, also an unquoted
// run of printable ASCII with no space, quote or backslash.
func parseKey(values []string, max int, bare bool) (string, error) {
	switch len(values) {
	case 0:
		return "", errNoKey
	case 1:
	default:
		return "", fmt.Errorf("%d Idempotency-Key fields: send one", len(values))
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", errors.New("the Idempotency-Key field is empty")
	}
	var key string
	if v[0] == '"' {
		k, rest, err := parseString(v)
		if err != nil {
			return "", err
		}
		if rest != "" {
			return "", fmt.Errorf("the Idempotency-Key field has %q after its string: send a single string", truncate(rest))
		}
		key = k
	} else {
		if !bare {
			return "", errors.New(`the Idempotency-Key field is not a Structured Field string: send it in double quotes, as "8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
				return "", fmt.Errorf("the Idempotency-Key has the character %q at %d: use printable ASCII without space, quote or backslash", c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", errors.New("the Idempotency-Key is the empty string")
	}
	if len(key) > max {
		return "", fmt.Errorf("the Idempotency-Key is %d characters long, longer than %d", len(key), max)
	}
	return key, nil
}

// parseString parses the sf-string at the start of v and returns it and
// what follows it.
func parseString(v string) (string, string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", "", errors.New(`the Idempotency-Key string has a backslash that escapes neither " nor \`)
			}
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), v[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("the Idempotency-Key string has the byte %#x at %d: a string holds printable ASCII only", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("the Idempotency-Key string has no closing quote")
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

package dedupe

import (
	"fmt"
	"unicode/utf8"
)

// MaxKeyLen is the longest scope or id, in bytes, that a Key may have.
const MaxKeyLen = 255

// Key identifies one logical operation: the message ID (ID) within the name
// of the handler that consumes it (Scope). Two handlers that consume the same
// message each apply it once, because their keys differ in scope.
type Key struct {
	// Scope is the stable name of the consumer: a handler name, not a host
	// or a pod name, since a key must survive restarts and rebalances.
	Scope string
	// ID is the idempotency key proper, usually the message UUID.
	ID string
}

// NewKey returns the key for id in scope, or an *InvalidKeyError.
func NewKey(scope, id string) (Key, error) {
	k := Key{Scope: scope, ID: id}
	if err := k.Validate(); err != nil {
		return Key{}, err
	}
	return k, nil
}

// Validate reports whether k can be stored: scope and id are non-empty,
// at most MaxKeyLen bytes of valid UTF-8, with no control characters.
// It returns an *InvalidKeyError that wraps ErrInvalidKey.
func (k Key) Validate() error {
	if reason := checkPart(k.Scope); reason != "" {
		return &InvalidKeyError{Key: k, Reason: "scope " + reason}
	}
	if reason := checkPart(k.ID); reason != "" {
		return &InvalidKeyError{Key: k, Reason: "id " + reason}
	}
	return nil
}

func checkPart(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxKeyLen:
		return fmt.Sprintf("is %d bytes long, longer than %d", len(s), MaxKeyLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Sprintf("has a control character %U at byte %d", r, i)
		}
	}
	return ""
}

// String returns "scope/id", for logs and errors.
func (k Key) String() string { return k.Scope + "/" + k.ID }

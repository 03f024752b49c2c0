package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

// KeyFunc returns a message's idempotency key (the id part; the scope comes
// from the middleware). An empty id with a nil error means "no key": the
// middleware's MissingKeyPolicy decides.
type KeyFunc func(msg *message.Message) (string, error)

// KeyFromUUID keys a message by its Watermill UUID (header
// _watermill_message_uuid on Kafka). This is the default.
func KeyFromUUID(msg *message.Message) (string, error) { return msg.UUID, nil }

// KeyFromTimeOrderedUUID keys a message by its Watermill UUID when it is a
// UUIDv7 or a ULID, and refuses any other: TimeOrderedKey(KeyFromUUID).
// Use it where every producer mints time-ordered IDs, so that a random ID
// (which costs a cold index read per claim once the key table outgrows
// memory: docs/keys.md) is caught at once instead of slowly degrading the
// store.
func KeyFromTimeOrderedUUID(msg *message.Message) (string, error) { return timeOrdered(msg.UUID) }

// TimeOrderedKey wraps f so that it accepts only time-ordered IDs (a UUIDv7
// or a ULID, in either case) and returns them in canonical form (lowercase
// UUIDv7, upper-case ULID), so that copies written in another case are one
// key. Any other ID is an error wrapping dedupe.ErrNotTimeOrdered, which
// Config.MissingKey handles as an invalid key; an empty ID stays "no key".
func TimeOrderedKey(f KeyFunc) KeyFunc {
	return func(msg *message.Message) (string, error) {
		id, err := f(msg)
		if err != nil {
			return "", err
		}
		return timeOrdered(id)
	}
}

func timeOrdered(id string) (string, error) {
	if id == "" {
		return "", nil
	}
	t, err := dedupe.ParseTimeID(id)
	if err != nil {
		return "", err
	}
	return t.String(), nil
}

// KeyFromMetadata keys a message by a metadata field (a Kafka header).
func KeyFromMetadata(field string) KeyFunc {
	return func(msg *message.Message) (string, error) { return msg.Metadata.Get(field), nil }
}

// KeyFromJSONField keys a message by a field of its JSON payload; path is
// dot-separated ("command_id", "meta.id"). A string or a number may be the
// key; a payload that is not a JSON object is an error.
func KeyFromJSONField(path string) KeyFunc {
	parts := strings.Split(path, ".")
	return func(msg *message.Message) (string, error) {
		dec := json.NewDecoder(bytes.NewReader(msg.Payload))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return "", fmt.Errorf("payload is not JSON: %w", err)
		}
		for _, p := range parts {
			obj, ok := v.(map[string]any)
			if !ok {
				return "", fmt.Errorf("payload has no object at %q", p)
			}
			if v, ok = obj[p]; !ok {
				return "", nil
			}
		}
		switch x := v.(type) {
		case string:
			return x, nil
		case json.Number:
			return x.String(), nil
		case nil:
			return "", nil
		}
		return "", fmt.Errorf("field %q is a %T, not a string or a number", path, v)
	}
}

// KeyFromOffset keys a message by its Kafka coordinates, topic/partition/
// offset, read from its context ([dedupe.SourceFromContext], set by
// kafkapubsub.Subscriber). It catches redeliveries (rebalances, restarts, replays of the same
// records) but not a producer's retries, which land at new offsets, nor
// records copied to another topic.
func KeyFromOffset(msg *message.Message) (string, error) {
	src, ok := dedupe.SourceFromContext(msg.Context())
	if !ok {
		return "", errors.New("message has no Kafka coordinates in its context")
	}
	return src.Topic + "/" + strconv.Itoa(int(src.Partition)) + "/" + strconv.FormatInt(src.Offset, 10), nil
}

// MissingKeyPolicy says what happens to a message whose key is missing or
// invalid (empty, longer than dedupe.MaxKeyLen, with control characters).
type MissingKeyPolicy int

const (
	// Reject fails the message with a permanent *dedupe.InvalidKeyError,
	// for the PoisonQueue to send to the dead-letter topic. The default.
	Reject MissingKeyPolicy = iota
	// Skip runs the handler without protection (in a transaction, but with
	// no key): a redelivery applies it again. Counted by Hooks as OutcomeSkipped.
	Skip
	// Derive keys the message by KeyFromOffset instead. It catches
	// redeliveries, not a producer's retries.
	Derive
)

func (p MissingKeyPolicy) String() string {
	switch p {
	case Reject:
		return "reject"
	case Skip:
		return "skip"
	case Derive:
		return "derive"
	}
	return fmt.Sprintf("MissingKeyPolicy(%d)", int(p))
}

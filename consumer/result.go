package consumer

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/msgid"
)

// recordTimestamp is the metadata in which kafkapubsub's Subscriber hands
// over a record's timestamp (kafkapubsub.MetadataTimestamp, RFC 3339).
const recordTimestamp = "kafka_timestamp"

// fillOutputIDs gives every output of in (whose key is key) that has no
// UUID one derived from key and the output's index: applied again (after
// a restore lost its key), in gives its outputs the same IDs, and the
// consumers downstream find them duplicates. The time bits are in's own
// when its UUID is a UUIDv7, else its record's timestamp; an input with
// neither (not from a kafkapubsub Subscriber, its ID not a UUIDv7) gives
// its outputs new UUIDv7s, which a re-application does not repeat.
// Outputs that have a UUID keep it. Per message and batch mode both call it, before the
// outputs are stored or written to the outbox.
func fillOutputIDs(key dedupe.Key, in *message.Message, outs []*message.Message) {
	var at time.Time
	for i, o := range outs {
		if o == nil || o.UUID != "" {
			continue
		}
		if at.IsZero() && in != nil {
			at, _ = time.Parse(time.RFC3339Nano, in.Metadata.Get(recordTimestamp))
		}
		var inID string
		if in != nil {
			inID = in.UUID
		}
		if id, ok := msgid.Derive(key.Scope, key.ID, i, inID, at); ok {
			o.UUID = id
		} else {
			o.UUID = msgid.New()
		}
	}
}

// storedMessage is one output message as stored in the key's result.
type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

// encodeOutputs stores the handler's output messages so duplicates can
// re-publish them with the same UUIDs; an output with no UUID still (see
// fillOutputIDs) gets a UUIDv7 first. No outputs store nothing.
func encodeOutputs(msgs []*message.Message) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	msgid.Fill(msgs)
	out := make([]storedMessage, len(msgs))
	for i, m := range msgs {
		out[i] = storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	}
	return json.Marshal(out)
}

// StoredOutputs returns the output messages stored as a key's result
// ([dedupe.Record.Result]), as a duplicate gets them back: nil when the
// handler returned none, or when Config.Outputs took them.
func StoredOutputs(result []byte) ([]*message.Message, error) { return decodeOutputs(result) }

func decodeOutputs(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var in []storedMessage
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("consumer: stored result is not a list of messages: %w", err)
	}
	msgs := make([]*message.Message, len(in))
	for i, s := range in {
		m := message.NewMessage(s.UUID, s.Payload)
		if s.Metadata != nil {
			m.Metadata = s.Metadata
		}
		msgs[i] = m
	}
	return msgs, nil
}

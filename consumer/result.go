package consumer

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/msgid"
)

// storedMessage is one output message as stored in the key's result.
type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

// encodeOutputs stores the handler's output messages so duplicates can
// re-publish them with the same UUIDs; an output with no UUID gets a
// UUIDv7 first. No outputs store nothing.
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

// Package message is the part of Watermill's API that the analyzer looks at.
package message

import "context"

type Message struct {
	UUID    string
	Payload []byte
}

func (m *Message) Ack() bool                { return true }
func (m *Message) Nack() bool               { return true }
func (m *Message) Context() context.Context { return context.Background() }

type HandlerFunc func(msg *Message) ([]*Message, error)

// Package consumer is the part of exactly's consumer API that the analyzer looks at.
package consumer

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error)

func TxHandler(fn TxHandlerFunc) message.HandlerFunc   { return nil }
func Tx(msg *message.Message) (pgx.Tx, bool)           { return nil, false }
func TxFromContext(ctx context.Context) (pgx.Tx, bool) { return nil, false }

type MessageError struct {
	Index int
	Err   error
}

func (e *MessageError) Error() string { return "" }

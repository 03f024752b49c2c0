package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/txguard"
)

// newSlot returns the slot of msg's transaction tx.
func newSlot(tx pgx.Tx, msg *message.Message) *txSlot {
	return &txSlot{tx: txguard.Wrap(tx, "the handler of message "+msg.UUID)}
}

// broken returns the permanent error of a handler that broke slot's
// transaction (see txguard.Tx.Check), given what the handler returned.
func (slot *txSlot) broken(handlerErr error) error {
	if err := slot.tx.Check(handlerErr); err != nil {
		return dedupe.Permanent(fmt.Errorf("consumer: %w", err))
	}
	return nil
}

type txKey struct{}

// txSlot is the message's transaction as handed to its handler: it serves
// one TxHandler call, and remembers that call's failure or outputs.
type txSlot struct {
	tx     *txguard.Tx
	calls  atomic.Int32
	failed atomic.Bool
	outs   atomic.Pointer[[]*message.Message]
}

// dropped returns how many of the outputs that the TxHandler returned on
// slot are not among got, the outputs that reached the middleware.
func (slot *txSlot) dropped(got []*message.Message) int {
	p := slot.outs.Load()
	if p == nil || len(*p) == 0 {
		return 0
	}
	seen := make(map[string]bool, len(got))
	for _, m := range got {
		if m != nil {
			seen[m.UUID] = true
		}
	}
	n := 0
	for _, m := range *p {
		if m != nil && !seen[m.UUID] {
			n++
		}
	}
	return n
}

// errDropped is the error for outputs that did not reach Config.Outputs.
func errDropped(msg *message.Message, n int) error {
	return fmt.Errorf("consumer: %w: the handler of message %s returned %d output messages that never reached the "+
		"dedupe middleware, so Config.Outputs cannot write them to the outbox; nothing is committed: register the "+
		"handler with router.AddHandler (router.AddConsumerHandler discards a handler's outputs), and let no "+
		"middleware between the dedupe middleware and the handler drop them", dedupe.ErrMisconfigured, msg.UUID, n)
}

// TxFromContext returns the transaction the middleware opened for the
// message whose context is ctx (transactional mode). Prefer TxHandler: it
// also refuses a second run of the handler on the same transaction.
//
// The transaction is the middleware's: its Commit and Rollback return an
// error, and a handler that calls them (or ends the transaction with SQL,
// or returns nil after a statement failed in it) fails its message for
// good, to the dead-letter topic with the reason. A handler returns an
// error to roll back, and uses tx.Begin (a savepoint) around a statement
// that may fail.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	slot, ok := ctx.Value(txKey{}).(*txSlot)
	if !ok {
		return nil, false
	}
	return slot.tx, true
}

// Tx returns the message's transaction: TxFromContext(msg.Context()).
func Tx(msg *message.Message) (pgx.Tx, bool) { return TxFromContext(msg.Context()) }

// TxHandlerFunc is a handler that takes the middleware's transaction.
type TxHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)

// ErrNoTx is returned by a TxHandler run without the middleware (or in lease mode).
var ErrNoTx = errors.New("consumer: no transaction in the message context: add the exactly middleware in transactional mode")

// chainOrder names the order that fixes every chain trap.
const chainOrder = "add middleware in the order PoisonQueue, Retry if any (with ShouldRetry and ResetContextOnRetry), " +
	"Timeout, the dedupe middleware, Recoverer"

// TxHandler adapts fn to a Watermill handler; the middleware must wrap it.
// The transaction serves one call: a middleware between the dedupe
// middleware and the handler that runs the handler again (Retry) or turns
// its error into success (PoisonQueue) would apply the first attempt's
// writes with the second's, so the second call fails, and a swallowed
// error rolls the transaction back, with an error wrapping
// dedupe.ErrMisconfigured that names the right order. It also tells the
// middleware what fn returned, so that outputs dropped on their way to
// Config.Outputs (a registration with router.AddConsumerHandler) fail the
// message instead of committing it without them.
func TxHandler(fn TxHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		slot, ok := msg.Context().Value(txKey{}).(*txSlot)
		if !ok {
			return nil, ErrNoTx
		}
		if slot.calls.Add(1) > 1 {
			return nil, fmt.Errorf("consumer: %w: the handler of message %s ran twice on one transaction, "+
				"on top of the first attempt's writes: a Retry sits inside the dedupe middleware; %s",
				dedupe.ErrMisconfigured, msg.UUID, chainOrder)
		}
		outs, err := fn(msg.Context(), slot.tx, msg)
		if err != nil {
			slot.failed.Store(true)
		} else {
			slot.outs.Store(&outs)
		}
		return outs, err
	}
}

// ShouldRetry is for middleware.Retry's ShouldRetry: it does not retry
// permanent errors, which no retry can fix, nor configuration errors.
func ShouldRetry(p middleware.RetryParams) bool {
	return !dedupe.IsPermanent(p.Err) && !errors.Is(p.Err, dedupe.ErrMisconfigured)
}

package consumer

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/pgtx"
)

// many takes msgs down the per-message path at once: messages that were not
// applied with their batch and never will be in it (key reused, in flight,
// a permanent error of their own), whose order does not matter.
func (c *BatchConsumer) many(msgs []*message.Message) {
	if len(msgs) == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, m := range msgs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.one(m)
		}()
	}
	wg.Wait()
}

// one takes msg down the per-message path and acks or nacks it; it
// reports whether it acked.
func (c *BatchConsumer) one(msg *message.Message) bool {
	outs, err := c.single(msg)
	if err == nil {
		err = c.publish(outs)
	}
	if err != nil {
		msg.Nack()
		return false
	}
	msg.Ack()
	return true
}

// plainOne is the per-message path with NoDedupe.
func (c *BatchConsumer) plainOne(msg *message.Message) ([]*message.Message, error) {
	var outs [][]*message.Message
	err := c.plain(msg.Context(), func(tx pgx.Tx) error {
		var err error
		if outs, err = c.call(msg.Context(), tx, []*message.Message{msg}); err == nil {
			err = c.writeOutputs(msg.Context(), tx, outs)
		}
		return err
	})
	if err != nil || len(outs) == 0 || c.cfg.Outputs != nil {
		return nil, err
	}
	return outs[0], nil
}

// plain runs fn in a transaction with no keys.
func (c *BatchConsumer) plain(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer pgtx.Rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: commit: %w", err)
	}
	return nil
}

func nackAll(msgs []*message.Message) {
	for _, m := range msgs {
		m.Nack()
	}
}

func nackItems(items []item) {
	for _, it := range items {
		it.msg.Nack()
	}
}

package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// cut applies items in offset order with each message at (ascending
// indexes) alone on the per-message path: the messages before the first
// as a batch, the first alone, the messages up to the next as a batch, and
// so on. It stops at the first nack, nacking everything after it.
func (c *BatchConsumer) cut(ctx context.Context, items []item, at []int) (stopped bool) {
	from := 0
	for _, i := range at {
		if c.apply(ctx, items[from:i], time.Now()) {
			nackItems(items[i:])
			return true
		}
		if !c.one(items[i].msg) {
			nackItems(items[i+1:])
			return true
		}
		from = i + 1
	}
	return c.apply(ctx, items[from:], time.Now())
}

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

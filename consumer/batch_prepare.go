package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

// item is one message of a batch with its claim request.
type item struct {
	msg *message.Message
	req dedupe.Request
	ev  Event
	// outs are the outputs to publish after the commit.
	outs []*message.Message
}

// process applies a batch. A message with no valid key or fingerprint
// splits it: the messages before it go first, then it alone on the
// per-message path, then the rest, so each partition's order holds.
func (c *BatchConsumer) process(ctx context.Context, batch []*message.Message) {
	start := time.Now()
	items := make([]item, 0, len(batch))
	for i, msg := range batch {
		it, ok := c.prepare(msg)
		if ok {
			items = append(items, it)
			continue
		}
		if c.apply(ctx, items, start) {
			nackAll(batch[i:])
			return
		}
		items = nil
		if !c.one(msg) {
			nackAll(batch[i+1:])
			return
		}
	}
	c.apply(ctx, items, start)
}

// prepare computes a message's key and fingerprint; false when it must
// take the per-message path (no valid key, or a payload that cannot be
// fingerprinted, where the middleware applies Config.MissingKey; or a
// message delivered too often across members, which the middleware
// dead-letters without running the handler).
func (c *BatchConsumer) prepare(msg *message.Message) (item, bool) {
	it := item{msg: msg, ev: Event{Scope: c.cfg.Scope, Offset: -1}}
	if c.mw.overDelivered(msg) != nil {
		return it, false
	}
	src, hasSrc := c.source(msg)
	if hasSrc {
		it.ev.Topic, it.ev.Partition, it.ev.Offset = src.Topic, src.Partition, src.Offset
		it.req.Source = src
	}
	key, err := c.mw.keyOf(msg, c.cfg.Scope)
	if err != nil {
		return it, false
	}
	fp, err := c.cfg.FingerprintFunc(msg.Payload)
	if err != nil {
		return it, false
	}
	it.ev.Key = key.ID
	it.req.Key, it.req.Fingerprint, it.req.TTL = key, fp, c.cfg.TTL
	return it, true
}

func (c *BatchConsumer) source(msg *message.Message) (dedupe.Source, bool) { return c.mw.source(msg) }

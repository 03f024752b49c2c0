package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// loop forms batches from msgs and applies them, one at a time.
//
// A nacked message holds its partition back: the Subscriber's window may
// already have delivered later messages of that partition, and applying
// them before the nacked one comes back would break its key's order. So
// until the lowest nacked offset of a partition is delivered again, every
// later message of that partition is nacked unapplied (the window then
// delivers them again in offset order, after it). A hold that outlives
// holdTimeout is dropped: the partition has moved to another member, which
// went past the nacked message, and came back.
func (c *BatchConsumer) loop(ctx context.Context, msgs <-chan *message.Message) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	type hold struct {
		offset int64 // the lowest nacked offset, not yet back
		since  time.Time
	}
	type partition struct {
		topic string
		n     int32
	}
	held := map[partition]hold{}
	admit := func(m *message.Message) bool {
		src, ok := c.source(m)
		if !ok {
			return true
		}
		p := partition{src.Topic, src.Partition}
		h, isHeld := held[p]
		switch {
		case !isHeld || src.Offset < h.offset:
			return true
		case src.Offset == h.offset || time.Since(h.since) > holdTimeout:
			delete(held, p)
			return true
		}
		m.Nack()
		return false
	}
	for {
		var batch []*message.Message
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			if admit(m) {
				batch = append(batch, m)
			}
		}
		if len(batch) == 0 {
			continue
		}
		timer.Reset(c.cfg.MaxWait)
		open := true
	fill:
		for len(batch) < c.cfg.MaxSize {
			select {
			case m, ok := <-msgs:
				if !ok {
					open = false
					break fill
				}
				if admit(m) {
					batch = append(batch, m)
				}
			case <-timer.C:
				break fill
			case <-ctx.Done():
				return
			}
		}
		timer.Stop()
		c.process(ctx, batch)
		for _, m := range batch {
			select {
			case <-m.Nacked():
			default:
				continue
			}
			if src, ok := c.source(m); ok {
				p := partition{src.Topic, src.Partition}
				if h, isHeld := held[p]; !isHeld || src.Offset < h.offset {
					held[p] = hold{offset: src.Offset, since: time.Now()}
				}
			}
		}
		if !open {
			return
		}
	}
}

// holdTimeout bounds how long a nacked message holds its partition back
// (see loop): far above the Subscriber's longest nack back-off.
const holdTimeout = time.Minute

package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

func (c *BatchConsumer) writeOutputs(ctx context.Context, tx pgx.Tx, outs [][]*message.Message) error {
	if c.cfg.Outputs == nil {
		return nil
	}
	var all []*message.Message
	for _, o := range outs {
		all = append(all, o...)
	}
	if len(all) == 0 {
		return nil
	}
	return c.cfg.Outputs.WriteOutputsTx(ctx, tx, all)
}

// finish publishes and acks a committed batch, in order. A message whose
// claim failed on its own (key reused, in flight) takes the per-message
// path, which dead-letters or retries it. It reports whether it stopped
// at a nacked message (the rest nacked too).
func (c *BatchConsumer) finish(ctx context.Context, items []item, answers []dedupe.BatchClaim, start time.Time) (stopped bool) {
	d := time.Since(start)
	// The messages whose claim failed on its own were not applied: they
	// take the per-message path once the others are done. Those that can
	// never be applied (key reused) go all at once; those that wait for
	// their key (in flight) go one after the other, in order (no fresh
	// message came after them: see heldAt), and a nack among them stops
	// the batch there.
	var never, waiting []*message.Message
	defer func() {
		c.many(never)
		for i, m := range waiting {
			if stopped {
				m.Nack()
			} else if !c.one(m) {
				nackAll(waiting[i+1:])
				stopped = true
				return
			}
		}
	}()
	for i := range items {
		it, a := &items[i], answers[i]
		if a.Err != nil {
			if dedupe.IsPermanent(a.Err) {
				never = append(never, it.msg)
			} else {
				waiting = append(waiting, it.msg)
			}
			continue
		}
		outs := it.outs
		it.ev.Attempts, it.ev.Duration = a.Record.Attempts, d
		if a.Decision == dedupe.DecisionDuplicate {
			it.ev.Outcome = OutcomeDuplicate
			if c.cfg.Outputs == nil {
				var err error
				if outs, err = decodeOutputs(a.Record.Result); err != nil {
					c.cfg.Logger.ErrorContext(ctx, "consumer: duplicate's stored outputs unreadable", "key", it.ev.Key, "err", err)
				}
			}
		} else {
			it.ev.Outcome = OutcomeApplied
		}
		if err := c.publish(outs); err != nil {
			// The effects are committed: the redelivery is a duplicate and
			// publishes the stored outputs again.
			c.cfg.Logger.WarnContext(ctx, "consumer: publishing outputs failed; the message will be delivered again", "key", it.ev.Key, "err", err)
			it.ev.Err = err
			c.hook(it)
			it.msg.Nack()
			nackItems(items[i+1:])
			return true
		}
		c.hook(it)
		it.msg.Ack()
	}
	return false
}

// hook reports the item's Event with the message's own context, as the
// Middleware does: a tracer finds the message's trace there.
func (c *BatchConsumer) hook(it *item) {
	if c.cfg.Hooks != nil {
		c.cfg.Hooks.OnMessage(it.msg.Context(), it.ev)
	}
}

func (c *BatchConsumer) publish(outs []*message.Message) error {
	if len(outs) == 0 || c.cfg.Publisher == nil || c.cfg.OutputTopic == "" {
		return nil
	}
	return c.cfg.Publisher.Publish(c.cfg.OutputTopic, outs...)
}

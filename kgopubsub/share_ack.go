package kgopubsub

import (
	"context"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
)

// lockMargin is how much of a record's lock must be left for the handler
// to get it again after a Nack; with less, the record is released to the
// group.
const lockMargin = time.Second

// deliver hands r to the handler until it is acknowledged, or released.
func (sub *shareSub) deliver(r *kgo.Record) {
	s := sub.s
	offset := originOffset(r)
	from := originAt(r, offset)
	if sub.rejected(from) {
		// Dead-lettered in an earlier delivery whose Reject came after its
		// lock ran out.
		r.Ack(kgo.AckReject)
		return
	}
	deliveries := priorDeliveries(r) + int(r.DeliveryCount())
	// Once r is copied, a delivery that does not succeed accepts it rather
	// than releasing it: the copy carries the command on, and r is copied
	// again only when the member holding it dies.
	letGo := kgo.AckRelease
	if copyFrom(sub.limit.Load()) <= r.DeliveryCount() && sub.copyAhead(r, deliveries, from) {
		// The copy carries the command on: r is accepted at once, before
		// its handler runs, so that a handler that kills its process (an
		// OOM) leaves the copy alone, not r released to be copied again
		// (each death would add a copy, without bound).
		letGo = kgo.AckAccept
		r.Ack(kgo.AckAccept)
		fctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), copyTimeout)
		if err := sub.cl.FlushAcks(fctx); err != nil {
			s.cfg.Logger.Warn("kgopubsub: a copied record's acceptance was not sent: if its member dies, it is copied again", "group", s.cfg.ConsumerGroup,
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
		}
		cancel()
	}
	backoff := s.cfg.NackBackoff
	for {
		msg := toWatermill(r, strconv.Itoa(int(r.Partition)), nil)
		msg.Metadata[MetadataDeliveryCount] = strconv.Itoa(deliveries)
		mctx, cancel := context.WithCancel(context.WithoutCancel(sub.ctx))
		mctx = dedupe.ContextWithDeliveries(withArrived(mctx, r), deliveries)
		// A copy carries its original's coordinates: keys made of them
		// (consumer.KeyFromOffset, MissingKey Derive) are the original's.
		msg.SetContext(dedupe.ContextWithSource(mctx, dedupe.Source{Topic: r.Topic, Partition: r.Partition, Offset: offset}))
		if sub.ctx.Err() != nil {
			// Ended: never handed out, even to a reader that is ready.
			cancel()
			r.Ack(letGo)
			return
		}
		select {
		case sub.out <- msg:
		case <-sub.ctx.Done():
			cancel()
			r.Ack(letGo)
			return
		}
		acked, done := sub.await(msg)
		cancel()
		switch {
		case !done:
			r.Ack(letGo)
			return
		case acked && deadLettered(msg, r):
			sub.reject(r, from)
			return
		case acked:
			r.Ack(kgo.AckAccept)
			return
		}
		if sub.ctx.Err() != nil || time.Until(r.AcquisitionDeadline()) < backoff+lockMargin {
			r.Ack(letGo)
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-sub.ctx.Done():
			t.Stop()
			r.Ack(letGo)
			return
		}
		backoff = min(2*backoff, s.cfg.MaxNackBackoff)
	}
}

// await waits for msg's Ack or Nack; after the subscription ends, for up
// to DrainTimeout. done is false when neither came.
func (sub *shareSub) await(msg *message.Message) (acked, done bool) {
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-sub.ctx.Done():
	}
	t := time.NewTimer(sub.s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-msg.Acked():
		return true, true
	case <-msg.Nacked():
		return false, true
	case <-t.C:
		return false, false
	}
}

// deadLettered says whether msg was dead-lettered while it was delivered:
// middleware.PoisonQueue set a reason the record did not arrive with.
func deadLettered(msg *message.Message, r *kgo.Record) bool {
	reason := msg.Metadata.Get(middleware.ReasonForPoisonedKey)
	if reason == "" {
		return false
	}
	for _, h := range r.Headers {
		if h.Key == middleware.ReasonForPoisonedKey && string(h.Value) == reason {
			return false
		}
	}
	return true
}

// reject rejects r, dead-lettered, and remembers its command, whose
// origin is from.
func (sub *shareSub) reject(r *kgo.Record, from string) {
	sub.mu.Lock()
	if len(sub.dead) >= maxDead {
		clear(sub.dead)
	}
	sub.dead[from] = struct{}{}
	sub.mu.Unlock()
	r.Ack(kgo.AckReject)
}

// rejected says whether the command whose origin is from was dead-lettered
// here before.
func (sub *shareSub) rejected(from string) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	_, ok := sub.dead[from]
	return ok
}

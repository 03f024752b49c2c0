package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
)

// consumePartition reads one partition in order and delivers it through a
// window of up to MaxInFlight messages (see [window]). subCtx carries the
// subscription's values into message contexts; stopCtx ends the reading,
// after which the in-flight messages drain. acked is called with the next
// offset to commit each time the watermark moves: after acks, and after a
// run of hidden records (transaction markers, aborted records).
func (s *Subscriber) consumePartition(subCtx, stopCtx context.Context, topic string, partition int, start int64, out chan<- *message.Message, acked func(next int64)) {
	f := &fetcher{
		transport: s.transport(topic), addr: kafka.TCP(s.cfg.Brokers...), topic: topic, partition: partition,
		committed: s.cfg.Isolation == ReadCommitted, maxBytes: s.cfg.MaxBytes, maxWait: s.cfg.MaxWait,
	}
	pos, ok := s.resolveOffset(stopCtx, topic, partition, start)
	if !ok {
		return
	}
	// The next response is fetched while this one is delivered.
	ctx, cancel := context.WithCancel(stopCtx)
	responses := make(chan fetched, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.fetchLoop(ctx, f, pos, responses)
	}()
	defer func() { cancel(); <-done }()

	w := newWindow(s.cfg.MaxInFlight, s.cfg.KeyOrdered, pos)
	// Each entry in flight has at most one event on its way (its ack or
	// nack, then its back-off's end), so sends never wait.
	events := make(chan windowEvent, s.cfg.MaxInFlight)
	quit := make(chan struct{})
	defer close(quit)
	committed := pos
	report := func() {
		if wm := w.watermark(); wm > committed {
			committed = wm
			acked(committed)
		}
	}
	var res fetched
	taken, pending := 0, false // records of res taken into w; res not fully taken
	withHandler := 0           // entries delivered and not yet acked or nacked
	var unwatched []*entry     // of those, the ones without a watch goroutine
	for {
		for pending && taken < len(res.records) && !w.full() {
			w.add(res.records[taken], s.cfg.NackBackoff)
			taken++
		}
		if pending && taken == len(res.records) {
			// Hidden records after the last one: commit past them, or the
			// partition looks lagging forever when its tail is a
			// transaction marker.
			w.skip(res.next)
			res, pending = fetched{}, false
		}
		report()
		var in <-chan fetched
		if !pending {
			in = responses
		}
		var send chan<- *message.Message
		var msg *message.Message
		e := w.next()
		if e != nil {
			if e.msg == nil {
				s.prepare(subCtx, e)
			}
			send, msg = out, e.msg
		}
		// One message with the handler (always so with MaxInFlight 1) is
		// waited for here; several get a goroutine each that reports its
		// ack or nack as an event.
		var direct *entry
		var ackedCh, nackedCh <-chan struct{}
		if withHandler == 1 && len(unwatched) == 1 {
			direct = unwatched[0]
			ackedCh, nackedCh = direct.msg.Acked(), direct.msg.Nacked()
		} else {
			for _, u := range unwatched {
				go watch(u, u.msg, events, quit)
			}
			unwatched = unwatched[:0]
		}
		select {
		case res = <-in:
			taken, pending = 0, true
		case send <- msg:
			w.sent(e)
			withHandler++
			unwatched = append(unwatched, e)
		case <-ackedCh:
			unwatched, withHandler = unwatched[:0], withHandler-1
			s.handle(w, windowEvent{e: direct, msg: direct.msg, acked: true}, events, quit)
		case <-nackedCh:
			unwatched, withHandler = unwatched[:0], withHandler-1
			s.handle(w, windowEvent{e: direct, msg: direct.msg}, events, quit)
		case ev := <-events:
			if ev.msg != nil {
				withHandler--
			}
			s.handle(w, ev, events, quit)
		case <-stopCtx.Done():
			for _, u := range unwatched {
				go watch(u, u.msg, events, quit)
			}
			s.drain(w, events)
			report()
			return
		}
	}
}

// windowEvent says that the delivery msg of e was acked or nacked, or (msg
// nil) that e's back-off is over.
type windowEvent struct {
	e     *entry
	msg   *message.Message
	acked bool
}

// prepare makes e's next delivery, its context carrying the record's
// coordinates and the record as it arrived (for the Publisher).
func (s *Subscriber) prepare(subCtx context.Context, e *entry) {
	km := e.km
	msg := toWatermill(km)
	ctx, cancel := context.WithCancel(context.WithoutCancel(subCtx))
	ctx = withArrived(ctx, &e.km)
	msg.SetContext(dedupe.ContextWithSource(ctx, dedupe.Source{Topic: km.Topic, Partition: int32(km.Partition), Offset: km.Offset}))
	e.msg, e.cancel = msg, cancel
}

// watch reports msg's ack or nack.
func watch(e *entry, msg *message.Message, events chan<- windowEvent, quit <-chan struct{}) {
	var ev windowEvent
	select {
	case <-msg.Acked():
		ev = windowEvent{e: e, msg: msg, acked: true}
	case <-msg.Nacked():
		ev = windowEvent{e: e, msg: msg}
	case <-quit:
		return
	}
	select {
	case events <- ev:
	case <-quit:
	}
}

// handle applies an event to w while the partition runs.
func (s *Subscriber) handle(w *window, ev windowEvent, events chan<- windowEvent, quit <-chan struct{}) {
	e := ev.e
	if ev.msg == nil {
		e.retry = nil
		w.retry(e)
		return
	}
	e.cancel()
	e.msg, e.cancel = nil, nil
	if ev.acked {
		w.acked(e)
		return
	}
	w.nacked(e)
	e.retry = time.AfterFunc(e.backoff, func() {
		select {
		case events <- windowEvent{e: e}:
		case <-quit:
		}
	})
	e.backoff = min(2*e.backoff, s.cfg.MaxNackBackoff)
}

// drain waits, up to DrainTimeout, for the messages of w that are with the
// handler, and gives up the rest: a message given up (not acked in time,
// nacked, or waiting for its back-off) is delivered again to the
// partition's next owner, from the watermark on.
func (s *Subscriber) drain(w *window, events <-chan windowEvent) {
	withHandler := 0
	for _, e := range w.entries {
		switch e.state {
		case delivered:
			withHandler++
		case backingOff:
			e.retry.Stop()
		}
	}
	defer func() {
		for _, e := range w.entries {
			if e.cancel != nil {
				e.cancel()
			}
		}
	}()
	if withHandler == 0 {
		return
	}
	// The handlers may be committing right now.
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	for withHandler > 0 {
		select {
		case ev := <-events:
			if ev.msg == nil || ev.e.state != delivered {
				continue // a back-off ended: that message is given up
			}
			withHandler--
			ev.e.cancel()
			ev.e.msg, ev.e.cancel = nil, nil
			if ev.acked {
				w.acked(ev.e)
			} else {
				ev.e.state = backingOff
			}
		case <-t.C:
			for _, e := range w.entries {
				if e.state == delivered {
					s.log().Warn("kafkapubsub: in-flight message not acked within DrainTimeout; it will be delivered again",
						"topic", e.km.Topic, "partition", e.km.Partition, "offset", e.km.Offset, "uuid", e.msg.UUID)
				}
			}
			return
		}
	}
}

// fetchLoop fetches f's partition from pos and sends every response that
// moves the position on, until ctx ends.
func (s *Subscriber) fetchLoop(ctx context.Context, f *fetcher, pos int64, responses chan<- fetched) {
	bo := retryBackoff()
	for {
		res, err := f.fetch(ctx, pos)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, kafka.OffsetOutOfRange) {
			// Retention removed the records at pos (or the topic was
			// recreated): start again where a new group would.
			next, ok := s.resolveOffset(ctx, f.topic, f.partition, int64(s.cfg.StartOffset))
			if !ok {
				return
			}
			s.log().Warn("kafkapubsub: offset out of range; starting again at StartOffset", "topic", f.topic, "partition", f.partition, "offset", pos, "restart", next)
			pos = next
			continue
		}
		if err != nil {
			s.log().Warn("kafkapubsub: fetch failed; retrying", "topic", f.topic, "partition", f.partition, "offset", pos, "err", err)
			if bo.Sleep(ctx) != nil {
				return
			}
			continue
		}
		bo.Reset()
		if res.next == pos && len(res.records) == 0 {
			continue
		}
		select {
		case responses <- res:
		case <-ctx.Done():
			return
		}
		pos = res.next
	}
}

// resolveOffset turns StartFirst and StartLast into an offset of partition,
// retrying until it succeeds or ctx ends (ok false).
func (s *Subscriber) resolveOffset(ctx context.Context, topic string, partition int, start int64) (int64, bool) {
	if start >= 0 {
		return start, true
	}
	c := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second, Transport: s.transport(topic)}
	isolation := kafka.ReadUncommitted
	if s.cfg.Isolation == ReadCommitted {
		isolation = kafka.ReadCommitted
	}
	for bo := retryBackoff(); ; {
		req := kafka.FirstOffsetOf(partition)
		if start == kafka.LastOffset {
			req = kafka.LastOffsetOf(partition)
		}
		res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {req}}, IsolationLevel: isolation})
		if err == nil {
			for _, p := range res.Topics[topic] {
				switch {
				case p.Partition != partition:
				case p.Error != nil:
					err = p.Error
				case start == kafka.LastOffset:
					return p.LastOffset, true
				default:
					return p.FirstOffset, true
				}
			}
			if err == nil {
				err = fmt.Errorf("no offsets for partition %d", partition)
			}
		}
		s.log().Warn("kafkapubsub: list offsets failed; retrying", "topic", topic, "partition", partition, "err", err)
		if bo.Sleep(ctx) != nil {
			return 0, false
		}
	}
}

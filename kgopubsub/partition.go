package kgopubsub

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/dedupe"
)

// partition is one assigned partition: the records polled for it and not
// yet taken by its goroutine, which delivers them through a window. When
// more than pauseAt records wait, fetching the partition pauses (franz-go
// then drops what it buffered for it and fetches it again on resume), so
// a partition held by an unacked message holds its own records and no
// other partition's.
type partition struct {
	topic string
	id    int32
	cl    *kgo.Client

	mu      sync.Mutex
	queue   [][]*kgo.Record
	queued  int
	paused  bool
	pauseAt int
	wake    chan struct{}

	stop context.CancelFunc
	done chan struct{}
}

func newPartition(cl *kgo.Client, topic string, id int32, pauseAt int) *partition {
	return &partition{topic: topic, id: id, cl: cl, pauseAt: pauseAt, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// push hands records polled for the partition to its goroutine. It never
// waits.
func (p *partition) push(rs []*kgo.Record) {
	if len(rs) == 0 {
		return
	}
	p.mu.Lock()
	p.queue = append(p.queue, rs)
	p.queued += len(rs)
	if !p.paused && p.queued >= p.pauseAt {
		p.paused = true
		p.cl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pop returns the oldest polled records, or nil.
func (p *partition) pop() []*kgo.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil
	}
	rs := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	p.queued -= len(rs)
	if p.paused && p.queued < p.pauseAt/2 {
		p.paused = false
		p.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
	return rs
}

// resume lets the partition be fetched again once its goroutine ended (a
// revoked partition assigned again must not stay paused).
func (p *partition) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		p.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
}

// consume delivers p's records in order through a window of up to
// MaxInFlight messages, as kafkapubsub's Subscriber does. subCtx carries
// the subscription's values into message contexts; stopCtx ends the
// delivery, after which the in-flight messages drain. acked is called with
// the next offset to commit each time the watermark moves.
//
// A delivered message's ack or nack is found by looking at it each time
// round the loop (up to maxUnwatched of them), and, while the loop waits,
// by waiting on the lowest of them directly when there is a message to
// send (the send, or that message's ack, brings the loop round again: the
// watermark cannot pass it before) or when it is the only one; otherwise,
// with nothing to send, and beyond maxUnwatched, each gets a goroutine
// that reports it on events.
func (s *Subscriber) consume(subCtx, stopCtx context.Context, p *partition, out chan<- *message.Message, acked func(next int64)) {
	defer close(p.done)
	base := context.WithoutCancel(subCtx)
	w := newWindow(s.cfg.MaxInFlight, s.cfg.KeyOrdered, -1)
	events := make(chan windowEvent, s.cfg.MaxInFlight)
	quit := make(chan struct{})
	defer close(quit)
	committed := int64(-1)
	report := func() {
		if wm := w.watermark(); wm > committed {
			committed = wm
			acked(committed)
		}
	}
	var batch []*kgo.Record
	taken := 0
	// unwatched are the messages with the handler that no goroutine
	// watches, in the order they went out; pending counts the events to
	// come (watching goroutines and back-off timers).
	var unwatched []*entry
	pending := 0
	for {
		if len(unwatched) > 0 {
			n := 0
			for _, u := range unwatched {
				switch {
				case isClosed(u.msg.Acked()):
					s.handle(w, windowEvent{e: u, msg: u.msg, acked: true}, events, quit, &pending)
				case isClosed(u.msg.Nacked()):
					s.handle(w, windowEvent{e: u, msg: u.msg}, events, quit, &pending)
				default:
					unwatched[n] = u
					n++
				}
			}
			clear(unwatched[n:])
			unwatched = unwatched[:n]
		}
		if taken == len(batch) {
			batch, taken = p.pop(), 0
		}
		for taken < len(batch) && !w.full() {
			r := batch[taken]
			taken++
			// Records polled before a seek (a partition fetched again
			// from an earlier offset) are never taken twice.
			if r.Offset < w.base {
				continue
			}
			w.add(r, s.cfg.NackBackoff)
		}
		report()
		var in <-chan struct{}
		if taken == len(batch) {
			in = p.wake
		}
		var send chan<- *message.Message
		var msg *message.Message
		e := w.next()
		if e != nil {
			if e.msg == nil {
				s.prepare(base, e)
			}
			send, msg = out, e.msg
		}
		watched := 0
		if send == nil && len(unwatched) > 1 {
			watched = len(unwatched)
		} else if len(unwatched) > maxUnwatched {
			watched = len(unwatched) - maxUnwatched
		}
		if watched > 0 {
			for _, u := range unwatched[:watched] {
				go watch(u, u.msg, events, quit)
			}
			pending += watched
			n := copy(unwatched, unwatched[watched:])
			clear(unwatched[n:])
			unwatched = unwatched[:n]
		}
		var direct *entry
		var ackedCh, nackedCh <-chan struct{}
		for _, u := range unwatched {
			if direct == nil || u.km.Offset < direct.km.Offset {
				direct = u
			}
		}
		if direct != nil {
			ackedCh, nackedCh = direct.msg.Acked(), direct.msg.Nacked()
		}
		if send == nil {
			// Whatever goes next is made while the handler works.
			if ne := w.upcoming(); ne != nil && ne.msg == nil {
				s.prepare(base, ne)
			}
		}
		var evs <-chan windowEvent
		if pending > 0 {
			evs = events
		}
		select {
		case <-in:
		case send <- msg:
			w.sent(e)
			unwatched = append(unwatched, e)
		case <-ackedCh:
			unwatched = remove(unwatched, direct)
			s.handle(w, windowEvent{e: direct, msg: direct.msg, acked: true}, events, quit, &pending)
		case <-nackedCh:
			unwatched = remove(unwatched, direct)
			s.handle(w, windowEvent{e: direct, msg: direct.msg}, events, quit, &pending)
		case ev := <-evs:
			pending--
			s.handle(w, ev, events, quit, &pending)
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

// maxUnwatched bounds the messages with the handler that a partition's
// goroutine looks at itself each time round its loop; the older ones get a
// goroutine each.
const maxUnwatched = 8

// isClosed says whether ch, an ack or nack channel, is closed. It never
// waits.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// remove removes e from es, keeping the order.
func remove(es []*entry, e *entry) []*entry {
	for i, x := range es {
		if x == e {
			copy(es[i:], es[i+1:])
			es[len(es)-1] = nil
			return es[:len(es)-1]
		}
	}
	return es
}

// windowEvent says that the delivery msg of e was acked or nacked, or (msg
// nil) that e's back-off is over.
type windowEvent struct {
	e     *entry
	msg   *message.Message
	acked bool
}

// prepare makes e's next delivery, its context carrying the record's
// coordinates (dedupe.SourceFromContext) and the record as it arrived.
// base is the subscription's context without its cancellation.
func (s *Subscriber) prepare(base context.Context, e *entry) {
	r := e.km
	msg := toWatermill(r)
	ctx, cancel := context.WithCancel(base)
	ctx = withArrived(ctx, r)
	msg.SetContext(dedupe.ContextWithSource(ctx, dedupe.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}))
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

// handle applies an event to w while the partition runs; pending counts
// the events to come, a back-off timer's included.
func (s *Subscriber) handle(w *window, ev windowEvent, events chan<- windowEvent, quit <-chan struct{}, pending *int) {
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
	*pending++
	e.retry = time.AfterFunc(e.backoff, func() {
		select {
		case events <- windowEvent{e: e}:
		case <-quit:
		}
	})
	e.backoff = min(2*e.backoff, s.cfg.MaxNackBackoff)
}

// drain waits, up to DrainTimeout, for the messages of w that are with the
// handler, and gives up the rest: a message given up is delivered again to
// the partition's next owner, from the watermark on.
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
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	for withHandler > 0 {
		select {
		case ev := <-events:
			if ev.msg == nil || ev.e.state != delivered {
				continue
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
					s.log().Warn("kgopubsub: in-flight message not acked within DrainTimeout; it will be delivered again",
						"topic", e.km.Topic, "partition", e.km.Partition, "offset", e.km.Offset, "uuid", e.msg.UUID)
				}
			}
			return
		}
	}
}

package delivery

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

// Config is what a partition's loop takes of its subscriber's
// configuration: the kafkapubsub.SubscriberConfig fields of the same
// names, defaulted (see Settings).
type Config struct {
	// MaxInFlight is how many of a partition's messages are out at once.
	MaxInFlight int
	// KeyOrdered lets out at most one message per key at a time.
	KeyOrdered bool
	// NackBackoff is a nacked message's first pause, doubled at each nack
	// up to MaxNackBackoff.
	NackBackoff    time.Duration
	MaxNackBackoff time.Duration
	// DrainTimeout bounds the wait for the messages with the handler when
	// the partition stops.
	DrainTimeout time.Duration
	// Logger gets the loop's warnings.
	Logger *slog.Logger
	// Name starts the loop's log messages: the transport's package name.
	Name string
}

// Batch is records of one partition in offset order, and Next, the
// position after them, hidden records (transaction markers, aborted
// records) included; 0 when the source does not say.
type Batch[R any] struct {
	Records []R
	Next    int64
}

// Partition is one partition's delivery: its records (of the transport's
// type R) go out through a window of up to MaxInFlight messages (see
// window).
type Partition[R any] struct {
	Config
	// Topic and Partition name the partition, for the logs.
	Topic     string
	Partition int32
	// Start is the partition's position, or -1 when it is known only from
	// its first record.
	Start int64
	// Meta returns a record's offset and key (nil for a null key).
	Meta func(r *R) (offset int64, key []byte)
	// Prepare makes the message of a delivery of r; the loop gives it its
	// context: the subscription's values, r (Arrived finds it, under R)
	// and its coordinates (dedupe.SourceFromContext), cancelled once the
	// message is acked or nacked, or given up.
	Prepare func(r *R) *message.Message
	// The records come from Batches, or, with Pop set, from Pop each time
	// Wake says there may be some (Pop returns nil when there are none).
	Batches <-chan Batch[R]
	Wake    <-chan struct{}
	Pop     func() []R
	// SkipSeen drops records below the position already taken in: those of
	// a source that may hand records out again after a seek.
	SkipSeen bool
}

// Run delivers the partition's records in order through its window.
// subCtx carries the subscription's values into message contexts; stopCtx
// ends the delivery, after which the in-flight messages drain. acked is
// called with the next offset to commit each time the watermark moves:
// after acks, and after a run of hidden records.
//
// A delivered message's ack or nack is found by looking at it each time
// round the loop (up to maxUnwatched of them), and, while the loop waits,
// by waiting on the lowest of them directly when there is a message to
// send (the send, or that message's ack, brings the loop round again: the
// watermark cannot pass it before) or when it is the only one; otherwise,
// with nothing to send, and beyond maxUnwatched, each gets a goroutine
// that reports it on events.
func (p *Partition[R]) Run(subCtx, stopCtx context.Context, out chan<- *message.Message, acked func(next int64)) {
	base := context.WithoutCancel(subCtx)
	w := newWindow[R](p.MaxInFlight, p.KeyOrdered, p.Start)
	events := make(chan windowEvent[R], p.MaxInFlight)
	quit := make(chan struct{})
	defer close(quit)
	committed := p.Start
	report := func() {
		if wm := w.watermark(); wm > committed {
			committed = wm
			acked(committed)
		}
	}
	var batch []R
	var next int64
	taken := 0
	// unwatched are the messages with the handler that no goroutine
	// watches, in the order they went out; pending counts the events to
	// come (watching goroutines and back-off timers).
	var unwatched []*entry[R]
	pending := 0
	for {
		if len(unwatched) > 0 {
			n := 0
			for _, u := range unwatched {
				switch {
				case isClosed(u.msg.Acked()):
					p.handle(w, windowEvent[R]{e: u, msg: u.msg, acked: true}, events, quit, &pending)
				case isClosed(u.msg.Nacked()):
					p.handle(w, windowEvent[R]{e: u, msg: u.msg}, events, quit, &pending)
				default:
					unwatched[n] = u
					n++
				}
			}
			clear(unwatched[n:])
			unwatched = unwatched[:n]
		}
		if taken == len(batch) && p.Pop != nil {
			batch, taken = p.Pop(), 0
		}
		for taken < len(batch) && !w.full() {
			r := &batch[taken]
			taken++
			offset, key := p.Meta(r)
			// Records handed out again after a seek (a partition fetched
			// again from an earlier offset) are never taken twice.
			if p.SkipSeen && offset < w.base {
				continue
			}
			w.add(*r, offset, key, p.NackBackoff)
		}
		if taken == len(batch) && next > 0 {
			// Hidden records after the last one: commit past them, or the
			// partition looks lagging forever when its tail is a
			// transaction marker.
			w.skip(next)
			batch, next, taken = nil, 0, 0
		}
		report()
		var wake <-chan struct{}
		var batches <-chan Batch[R]
		if taken == len(batch) {
			wake, batches = p.Wake, p.Batches
		}
		var send chan<- *message.Message
		var msg *message.Message
		e := w.next()
		if e != nil {
			if e.msg == nil {
				p.prepare(base, e)
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
		var direct *entry[R]
		var ackedCh, nackedCh <-chan struct{}
		for _, u := range unwatched {
			if direct == nil || u.offset < direct.offset {
				direct = u
			}
		}
		if direct != nil {
			ackedCh, nackedCh = direct.msg.Acked(), direct.msg.Nacked()
		}
		if send == nil {
			// Whatever goes next is made while the handler works.
			if ne := w.upcoming(); ne != nil && ne.msg == nil {
				p.prepare(base, ne)
			}
		}
		var evs <-chan windowEvent[R]
		if pending > 0 {
			evs = events
		}
		select {
		case <-wake:
		case b := <-batches:
			batch, next, taken = b.Records, b.Next, 0
		case send <- msg:
			w.sent(e)
			unwatched = append(unwatched, e)
		case <-ackedCh:
			unwatched = remove(unwatched, direct)
			p.handle(w, windowEvent[R]{e: direct, msg: direct.msg, acked: true}, events, quit, &pending)
		case <-nackedCh:
			unwatched = remove(unwatched, direct)
			p.handle(w, windowEvent[R]{e: direct, msg: direct.msg}, events, quit, &pending)
		case ev := <-evs:
			pending--
			p.handle(w, ev, events, quit, &pending)
		case <-stopCtx.Done():
			for _, u := range unwatched {
				go watch(u, u.msg, events, quit)
			}
			p.drain(w, events)
			report()
			return
		}
	}
}

// prepare makes e's next delivery: its message, and its context, which
// derives from base (the subscription's, without its cancellation).
func (p *Partition[R]) prepare(base context.Context, e *entry[R]) {
	e.msg = p.Prepare(&e.rec)
	e.ctx = newMsgContext(base, &e.rec, dedupe.Source{Topic: p.Topic, Partition: p.Partition, Offset: e.offset})
	e.msg.SetContext(e.ctx)
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
func remove[R any](es []*entry[R], e *entry[R]) []*entry[R] {
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
type windowEvent[R any] struct {
	e     *entry[R]
	msg   *message.Message
	acked bool
}

// watch reports msg's ack or nack.
func watch[R any](e *entry[R], msg *message.Message, events chan<- windowEvent[R], quit <-chan struct{}) {
	var ev windowEvent[R]
	select {
	case <-msg.Acked():
		ev = windowEvent[R]{e: e, msg: msg, acked: true}
	case <-msg.Nacked():
		ev = windowEvent[R]{e: e, msg: msg}
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
func (p *Partition[R]) handle(w *window[R], ev windowEvent[R], events chan<- windowEvent[R], quit <-chan struct{}, pending *int) {
	e := ev.e
	if ev.msg == nil {
		e.retry = nil
		w.retry(e)
		return
	}
	e.ctx.end()
	e.msg, e.ctx = nil, nil
	if ev.acked {
		w.acked(e)
		return
	}
	w.nacked(e)
	*pending++
	e.retry = time.AfterFunc(e.backoff, func() {
		select {
		case events <- windowEvent[R]{e: e}:
		case <-quit:
		}
	})
	e.backoff = min(2*e.backoff, p.MaxNackBackoff)
}

// drain waits, up to DrainTimeout, for the messages of w that are with the
// handler, and gives up the rest: a message given up (not acked in time,
// nacked, or waiting for its back-off) is delivered again to the
// partition's next owner, from the watermark on.
func (p *Partition[R]) drain(w *window[R], events <-chan windowEvent[R]) {
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
			if e.ctx != nil {
				e.ctx.end()
			}
		}
	}()
	if withHandler == 0 {
		return
	}
	// The handlers may be committing right now.
	t := time.NewTimer(p.DrainTimeout)
	defer t.Stop()
	for withHandler > 0 {
		select {
		case ev := <-events:
			if ev.msg == nil || ev.e.state != delivered {
				continue // a back-off ended: that message is given up
			}
			withHandler--
			ev.e.ctx.end()
			ev.e.msg, ev.e.ctx = nil, nil
			if ev.acked {
				w.acked(ev.e)
			} else {
				ev.e.state = backingOff
			}
		case <-t.C:
			for _, e := range w.entries {
				if e.state == delivered {
					p.Logger.Warn(p.Name+": in-flight message not acked within DrainTimeout; it will be delivered again",
						"topic", p.Topic, "partition", p.Partition, "offset", e.offset, "uuid", e.msg.UUID)
				}
			}
			return
		}
	}
}

package delivery

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// LookaheadFactor bounds a partition's window: it holds at most
// LookaheadFactor × MaxInFlight records from its lowest unacked offset on.
// Records acked above that offset still count, so a slow message at the
// bottom of the window stops new deliveries once the window is full, which
// bounds both memory and what a crash redelivers.
const LookaheadFactor = 4

// entryState is where one record of a window stands.
type entryState uint8

const (
	waiting    entryState = iota // fetched, never delivered
	delivered                    // with the handler, awaiting its ack
	backingOff                   // nacked: waits out its back-off, keeping its slot and key
	ready                        // back-off over: to be delivered again
	done                         // acked
)

// recordKey is a record's Kafka key as the key-ordered window sees it. All
// records with a null key share one recordKey, distinct from the empty key.
type recordKey struct {
	null bool
	key  string
}

// keyOf is the recordKey of a record whose key is key (nil for a null key).
func keyOf(key []byte) recordKey {
	if key == nil {
		return recordKey{null: true}
	}
	return recordKey{key: string(key)}
}

// entry is one record of a window: the transport's record rec, at offset.
type entry[R any] struct {
	rec     R
	offset  int64
	key     recordKey // with keyed only
	state   entryState
	backoff time.Duration // the next nack's pause
	// msg is the current delivery of the record (nil between deliveries),
	// ctx is its context, retry is its pending back-off timer.
	msg   *message.Message
	ctx   *msgContext[R]
	retry *time.Timer
}

// window is one partition's records from the lowest unacked offset to the
// newest fetched one, in offset order. Up to max of them are in flight
// (delivered, or nacked and waiting to be delivered again); with keyed, at
// most one per record key. It is owned by one goroutine.
type window[R any] struct {
	max, lookahead int
	keyed          bool
	entries        []*entry[R]
	inFlight       int
	ready          int // entries in state ready
	// nacks counts the entries nacked and not yet delivered again
	// (backingOff or ready).
	nacks int
	busy  map[recordKey]bool // with keyed: the keys in flight
	// slab is where the next entries are taken from, a block at a time;
	// store is the array entries lies in, which add reuses from its start
	// once acked entries have left room there.
	slab  []entry[R]
	store []*entry[R]
	// firstWaiting is the index of the first waiting entry, or len(entries):
	// no entry below it is waiting.
	firstWaiting int
	// base is the position after every record taken in, hidden records
	// skipped included: the watermark when the window is empty; -1 before
	// the first record when the starting position is not known.
	base int64
}

// newWindow returns an empty window whose position is pos (-1: not known
// before the first record).
func newWindow[R any](maxInFlight int, keyed bool, pos int64) *window[R] {
	return &window[R]{max: maxInFlight, lookahead: LookaheadFactor * maxInFlight, keyed: keyed, busy: map[recordKey]bool{}, base: pos}
}

// full says whether the window takes no more records.
func (w *window[R]) full() bool { return len(w.entries) >= w.lookahead }

// slabSize is how many entries a window allocates at once.
const slabSize = 64

// add takes in the next fetched record, r, at offset, whose key is key
// (nil for a null key).
func (w *window[R]) add(r R, offset int64, key []byte, backoff time.Duration) {
	if len(w.slab) == 0 {
		w.slab = make([]entry[R], min(slabSize, w.lookahead))
	}
	e := &w.slab[0]
	w.slab = w.slab[1:]
	*e = entry[R]{rec: r, offset: offset, backoff: backoff}
	if w.keyed {
		e.key = keyOf(key)
	}
	if len(w.entries) == cap(w.entries) {
		n := len(w.entries)
		if n >= cap(w.store)/2 {
			w.store = make([]*entry[R], max(16, 2*n))
		}
		copy(w.store, w.entries)
		clear(w.store[n:])
		w.entries = w.store[:n]
	}
	w.entries = append(w.entries, e)
	w.base = max(w.base, offset+1)
}

// skip moves the position past hidden records up to next.
func (w *window[R]) skip(next int64) { w.base = max(w.base, next) }

// watermark is the offset to commit: the lowest record not acked, or the
// position after everything taken in when every record is acked.
func (w *window[R]) watermark() int64 {
	if len(w.entries) > 0 {
		return w.entries[0].offset
	}
	return w.base
}

// next returns the entry to deliver now, or nil: a record whose back-off is
// over first (it holds the watermark), else, while fewer than max are in
// flight, the lowest waiting record — with keyed, the lowest whose key has
// nothing in flight.
func (w *window[R]) next() *entry[R] {
	if !w.keyed && w.nacks > 0 {
		// In offset order, a nack rewinds the partition as a seek would:
		// the nacked records go again lowest first, each only once every
		// lower nacked one is out again, and nothing new goes before them.
		for _, e := range w.entries {
			switch e.state {
			case ready:
				return e
			case backingOff:
				return nil
			}
		}
		return nil
	}
	if w.ready > 0 {
		for _, e := range w.entries {
			if e.state == ready {
				return e
			}
		}
	}
	if w.inFlight >= w.max {
		return nil
	}
	for _, e := range w.entries[w.firstWaiting:] {
		if e.state == waiting && (!w.keyed || !w.busy[e.key]) {
			return e
		}
	}
	return nil
}

// upcoming returns the waiting record next returns once a slot is free,
// or nil: the lowest waiting record (with keyed, the lowest whose key has
// nothing in flight) while no nacked record goes before it.
func (w *window[R]) upcoming() *entry[R] {
	if !w.keyed && w.nacks > 0 {
		return nil
	}
	for _, e := range w.entries[w.firstWaiting:] {
		if e.state == waiting && (!w.keyed || !w.busy[e.key]) {
			return e
		}
	}
	return nil
}

// nacked puts e in its back-off; it keeps its slot and its key.
func (w *window[R]) nacked(e *entry[R]) {
	e.state = backingOff
	w.nacks++
}

// retry makes e, whose back-off is over, the next to deliver.
func (w *window[R]) retry(e *entry[R]) {
	if e.state == backingOff {
		e.state = ready
		w.ready++
	}
}

// sent records that e went out on the channel.
func (w *window[R]) sent(e *entry[R]) {
	switch e.state {
	case waiting:
		w.inFlight++
		if w.keyed {
			w.busy[e.key] = true
		}
	case ready:
		w.ready--
		w.nacks--
	}
	e.state = delivered
	for w.firstWaiting < len(w.entries) && w.entries[w.firstWaiting].state != waiting {
		w.firstWaiting++
	}
}

// acked frees e's slot and key and drops acked entries from the bottom.
func (w *window[R]) acked(e *entry[R]) {
	e.state = done
	w.inFlight--
	if w.keyed {
		delete(w.busy, e.key)
	}
	n := 0
	for n < len(w.entries) && w.entries[n].state == done {
		n++
	}
	if n > 0 {
		clear(w.entries[:n])
		w.entries = w.entries[n:]
		w.firstWaiting -= n
	}
}

package delivery

import (
	"testing"
	"time"
)

// rec is a record as a transport hands it to a window.
type rec struct {
	Offset int64
	Key    []byte
}

func keyedRec(off int64, key string) rec {
	km := rec{Offset: off}
	if key != "-" {
		km.Key = []byte(key)
	}
	return km
}

// addRec takes r into w, as a partition's loop does.
func addRec(w *window[rec], r rec, backoff time.Duration) { w.add(r, r.Offset, r.Key, backoff) }

// takeAll delivers every entry the window lets out now and returns them.
func takeAll(w *window[rec]) []*entry[rec] {
	var out []*entry[rec]
	for e := w.next(); e != nil; e = w.next() {
		w.sent(e)
		out = append(out, e)
	}
	return out
}

func offsetsOf(es []*entry[rec]) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.offset)
	}
	return out
}

func sameOffsets(t *testing.T, what string, got []*entry[rec], want ...int64) {
	t.Helper()
	g := offsetsOf(got)
	if len(g) != len(want) {
		t.Fatalf("%s: delivered %v, want %v", what, g, want)
	}
	for i := range g {
		if g[i] != want[i] {
			t.Fatalf("%s: delivered %v, want %v", what, g, want)
		}
	}
}

// The watermark is the lowest unacked offset, whatever order acks come in.
func TestWindowWatermark(t *testing.T) {
	w := newWindow[rec](3, false, 10)
	for off := int64(10); off < 16; off++ {
		addRec(w, keyedRec(off, "k"), time.Millisecond)
	}
	es := takeAll(w)
	sameOffsets(t, "plain window of 3", es, 10, 11, 12)
	w.acked(es[2])
	w.acked(es[1])
	if wm := w.watermark(); wm != 10 {
		t.Fatalf("watermark %d after acks of 11 and 12, want 10 (10 is not acked)", wm)
	}
	sameOffsets(t, "two slots freed", takeAll(w), 13, 14)
	w.acked(es[0])
	if wm := w.watermark(); wm != 13 {
		t.Fatalf("watermark %d, want 13", wm)
	}
}

// A nacked message keeps its slot and its key through its back-off, and is
// delivered again before anything new.
func TestWindowNackKeepsSlotAndKey(t *testing.T) {
	w := newWindow[rec](2, true, 0)
	addRec(w, keyedRec(0, "a"), time.Millisecond)
	addRec(w, keyedRec(1, "a"), time.Millisecond)
	addRec(w, keyedRec(2, "b"), time.Millisecond)
	addRec(w, keyedRec(3, "c"), time.Millisecond)
	es := takeAll(w)
	sameOffsets(t, "key a busy: 1 waits, 2 goes", es, 0, 2)
	w.nacked(es[0])
	if e := w.next(); e != nil {
		t.Fatalf("delivered %d while a nacked message holds its slot", e.offset)
	}
	w.retry(es[0])
	sameOffsets(t, "redelivery", takeAll(w), 0)
	w.acked(es[1]) // offset 2
	sameOffsets(t, "key a still busy", takeAll(w), 3)
	w.acked(es[0])
	if wm := w.watermark(); wm != 1 {
		t.Fatalf("watermark %d, want 1", wm)
	}
	sameOffsets(t, "key a free", takeAll(w), 1)
}

// Null keys are one key; the empty key is another.
func TestWindowNullKeys(t *testing.T) {
	w := newWindow[rec](4, true, 0)
	addRec(w, keyedRec(0, "-"), time.Millisecond)
	addRec(w, keyedRec(1, "-"), time.Millisecond)
	addRec(w, keyedRec(2, ""), time.Millisecond)
	sameOffsets(t, "null keys share a gate", takeAll(w), 0, 2)
}

// The window holds LookaheadFactor × max records from the watermark on: a
// message held at the bottom stops new deliveries once it is full.
func TestWindowLookahead(t *testing.T) {
	w := newWindow[rec](2, false, 0)
	var off int64
	for ; !w.full(); off++ {
		addRec(w, keyedRec(off, "k"), time.Millisecond)
	}
	if off != LookaheadFactor*2 {
		t.Fatalf("window took %d records, want %d", off, LookaheadFactor*2)
	}
	first := takeAll(w)
	held := first[0]
	for _, e := range first[1:] {
		w.acked(e)
	}
	for {
		es := takeAll(w)
		if len(es) == 0 {
			break
		}
		for _, e := range es {
			if e != held {
				w.acked(e)
			}
		}
	}
	if !w.full() || w.watermark() != 0 {
		t.Fatalf("full %v watermark %d, want a full window held at 0", w.full(), w.watermark())
	}
	w.acked(held)
	if w.full() || w.watermark() != off {
		t.Fatalf("full %v watermark %d after the held ack, want an empty window at %d", w.full(), w.watermark(), off)
	}
}

// In offset order (not keyed), a nack rewinds the partition: nothing new
// goes out while nacked records wait, and they go out again lowest first,
// whatever order their back-offs end in.
func TestWindowNackRewindsInOffsetOrder(t *testing.T) {
	w := newWindow[rec](4, false, 0)
	for off := range int64(6) {
		addRec(w, keyedRec(off, "k"), time.Millisecond)
	}
	first := takeAll(w)
	sameOffsets(t, "first deliveries", first, 0, 1, 2, 3)
	w.nacked(first[2])
	w.nacked(first[0])
	w.acked(first[1])
	w.acked(first[3])
	sameOffsets(t, "while both back off", takeAll(w))
	w.retry(first[2])
	sameOffsets(t, "offset 2's back-off over, 0's not", takeAll(w))
	w.retry(first[0])
	sameOffsets(t, "both over: the nacked ones first, then the new ones", takeAll(w), 0, 2, 4, 5)
}

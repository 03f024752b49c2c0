package kafkapubsub

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func keyedRec(off int64, key string) kafka.Message {
	km := kafka.Message{Offset: off}
	if key != "-" {
		km.Key = []byte(key)
	}
	return km
}

// takeAll delivers every entry the window lets out now and returns them.
func takeAll(w *window) []*entry {
	var out []*entry
	for e := w.next(); e != nil; e = w.next() {
		w.sent(e)
		out = append(out, e)
	}
	return out
}

func offsetsOf(es []*entry) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.km.Offset)
	}
	return out
}

func sameOffsets(t *testing.T, what string, got []*entry, want ...int64) {
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
	w := newWindow(3, false, 10)
	for off := int64(10); off < 16; off++ {
		w.add(keyedRec(off, "k"), time.Millisecond)
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
	w := newWindow(2, true, 0)
	w.add(keyedRec(0, "a"), time.Millisecond)
	w.add(keyedRec(1, "a"), time.Millisecond)
	w.add(keyedRec(2, "b"), time.Millisecond)
	w.add(keyedRec(3, "c"), time.Millisecond)
	es := takeAll(w)
	sameOffsets(t, "key a busy: 1 waits, 2 goes", es, 0, 2)
	w.nacked(es[0])
	if e := w.next(); e != nil {
		t.Fatalf("delivered %d while a nacked message holds its slot", e.km.Offset)
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
	w := newWindow(4, true, 0)
	w.add(keyedRec(0, "-"), time.Millisecond)
	w.add(keyedRec(1, "-"), time.Millisecond)
	w.add(keyedRec(2, ""), time.Millisecond)
	sameOffsets(t, "null keys share a gate", takeAll(w), 0, 2)
}

// The window holds lookaheadFactor × max records from the watermark on: a
// message held at the bottom stops new deliveries once it is full.
func TestWindowLookahead(t *testing.T) {
	w := newWindow(2, false, 0)
	var off int64
	for ; !w.full(); off++ {
		w.add(keyedRec(off, "k"), time.Millisecond)
	}
	if off != lookaheadFactor*2 {
		t.Fatalf("window took %d records, want %d", off, lookaheadFactor*2)
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
	w := newWindow(4, false, 0)
	for off := range int64(6) {
		w.add(keyedRec(off, "k"), time.Millisecond)
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

// A share group's copy headers (kgopubsub) are no message metadata: the
// Subscriber leaves them out, and the Publisher never writes them from it,
// so that a record forwarded or dead-lettered by a consumer group is never
// taken for a copy.
func TestShareHeadersNotMetadata(t *testing.T) {
	km := kafka.Message{Topic: "t", Headers: []kafka.Header{
		{Key: "exactly_share_origin", Value: []byte("t/0/1")}, {Key: "exactly_share_deliveries", Value: []byte("3")}, {Key: "app", Value: []byte("x")}}}
	md := toWatermill(km).Metadata
	if md.Get("exactly_share_origin") != "" || md.Get("exactly_share_deliveries") != "" || md.Get("app") != "x" {
		t.Fatalf("metadata %v: want the application's header only", md)
	}
	if !reserved("exactly_share_origin") || !reserved("exactly_share_deliveries") {
		t.Fatal("a share copy's headers would be written from metadata")
	}
}

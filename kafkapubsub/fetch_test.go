package kafkapubsub

import (
	"fmt"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// Record batches as kafka-go decodes them, for the filter's pure logic.

func rec(off int64) protocol.Record {
	return protocol.Record{Offset: off, Value: protocol.NewBytes([]byte(fmt.Sprint(off)))}
}

func data(base, pid int64, txn bool, offs ...int64) protocol.RecordReader {
	var attrs protocol.Attributes
	if txn {
		attrs |= protocol.Transactional
	}
	recs := make([]protocol.Record, len(offs))
	for i, o := range offs {
		recs[i] = rec(o)
	}
	return &protocol.RecordBatch{Attributes: attrs, BaseOffset: base, ProducerID: pid, Records: protocol.NewRecordReader(recs...)}
}

func marker(off, pid int64, abort bool) protocol.RecordReader {
	typ := int16(1)
	if abort {
		typ = abortMarker
	}
	cb := protocol.NewControlBatch(protocol.ControlRecord{Offset: off, Type: typ})
	cb.BaseOffset, cb.ProducerID, cb.Attributes = off, pid, protocol.Transactional|protocol.Control
	return cb
}

func part(lso int64, aborted []fetchapi.ResponseTransaction, batches ...protocol.RecordReader) *fetchapi.ResponsePartition {
	return &fetchapi.ResponsePartition{LastStableOffset: lso, HighWatermark: lso, AbortedTransactions: aborted,
		RecordSet: protocol.RecordSet{Records: &protocol.RecordStream{Records: batches}}}
}

func TestFilterPartition(t *testing.T) {
	for _, tc := range []struct {
		name      string
		p         *fetchapi.ResponsePartition
		pos       int64
		committed bool
		want      []int64
		next      int64
	}{
		{"a fetch that starts mid-batch skips the records below the position",
			part(13, nil, data(10, -1, false, 10, 11, 12)), 11, true, []int64{11, 12}, 13},
		{"an aborted transaction whose first offset is below the position, listed again",
			part(13, []fetchapi.ResponseTransaction{{ProducerID: 7, FirstOffset: 5}},
				data(8, 7, true, 8, 9), marker(10, 7, true), data(11, 8, true, 11), marker(12, 8, false)),
			8, true, []int64{11}, 13},
		{"two producers interleaved, one aborts, the other commits",
			part(7, []fetchapi.ResponseTransaction{{ProducerID: 2, FirstOffset: 1}},
				data(0, 1, true, 0), data(1, 2, true, 1), data(2, 1, true, 2), data(3, 2, true, 3),
				marker(4, 2, true), data(5, 1, true, 5), marker(6, 1, false)),
			0, true, []int64{0, 2, 5}, 7},
		{"a producer aborts, then commits its next transaction",
			part(6, []fetchapi.ResponseTransaction{{ProducerID: 3, FirstOffset: 0}},
				data(0, 3, true, 0, 1), marker(2, 3, true), data(3, 3, true, 3, 4), marker(5, 3, false)),
			0, true, []int64{3, 4}, 6},
		{"nothing at or past the last stable offset",
			part(20, nil, data(18, -1, false, 18, 19), data(20, -1, false, 20)), 18, true, []int64{18, 19}, 20},
		{"a control record at the tail is stepped over",
			part(3, nil, data(0, 4, true, 0, 1), marker(2, 4, false)), 0, true, []int64{0, 1}, 3},
		{"an empty batch (compacted) followed by data",
			part(36, nil, data(30, 3, false), data(35, -1, false, 35)), 30, true, []int64{35}, 36},
		{"an empty batch at the tail moves the position on",
			part(40, nil, data(30, 3, false)), 31, true, nil, 32},
		{"a batch whose tail was compacted away",
			part(43, nil, data(40, -1, false, 40)), 41, true, nil, 42},
		{"read uncommitted delivers aborted records but never markers",
			part(3, []fetchapi.ResponseTransaction{{ProducerID: 7, FirstOffset: 0}},
				data(0, 7, true, 0, 1), marker(2, 7, true)), 0, false, []int64{0, 1}, 3},
		{"an empty response keeps the position",
			&fetchapi.ResponsePartition{LastStableOffset: 5, HighWatermark: 5}, 5, true, nil, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := filterPartition("t", tc.p, tc.pos, tc.committed, 0)
			if err != nil {
				t.Fatal(err)
			}
			var offs []int64
			for _, r := range got.all() {
				offs = append(offs, r.Offset)
				if string(r.Value) != fmt.Sprint(r.Offset) {
					t.Errorf("record %d has value %q", r.Offset, r.Value)
				}
			}
			if !slices.Equal(offs, tc.want) || got.next != tc.next {
				t.Fatalf("got records %v next %d, want %v next %d", offs, got.next, tc.want, tc.next)
			}
		})
	}
}

// Keys and values copied out of a response keep a null key null and an
// empty one empty, and appending to one never writes into the next.
func TestFetchedBytes(t *testing.T) {
	big := make([]byte, arenaBlock)
	recs := []protocol.Record{
		{Offset: 0, Key: nil, Value: protocol.NewBytes([]byte("a"))},
		{Offset: 1, Key: protocol.NewBytes([]byte{}), Value: protocol.NewBytes([]byte("b"))},
		{Offset: 2, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes(big)},
		{Offset: 3, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes([]byte("c"))},
	}
	p := part(4, nil, &protocol.RecordBatch{BaseOffset: 0, ProducerID: -1, Records: protocol.NewRecordReader(recs...)})
	got, err := filterPartition("t", p, 0, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := got.all()
	if len(r) != 4 || got.n != 4 {
		t.Fatalf("%d records (n %d), want 4", len(r), got.n)
	}
	if r[0].Key != nil || r[1].Key == nil || len(r[1].Key) != 0 || string(r[2].Key) != "k" {
		t.Fatalf("keys %q (nil %v), %q (nil %v), %q: want null, empty, k", r[0].Key, r[0].Key == nil, r[1].Key, r[1].Key == nil, r[2].Key)
	}
	if len(r[2].Value) != len(big) {
		t.Fatalf("a value of %d bytes came out with %d", len(big), len(r[2].Value))
	}
	_ = append(r[0].Value, 'x')
	if string(r[0].Value) != "a" || string(r[1].Value) != "b" || string(r[3].Value) != "c" {
		t.Fatalf("values %q %q %q after an append to the first, want a b c", r[0].Value, r[1].Value, r[3].Value)
	}
}

// all is every record of f, in order.
func (f fetched) all() []kafka.Message {
	var out []kafka.Message
	for _, c := range f.chunks {
		out = append(out, c...)
	}
	return out
}

// A response of many records comes in chunks, cut between record batches,
// that hold them all in order.
func TestFetchedChunks(t *testing.T) {
	var batches []protocol.RecordReader
	const perBatch = chunkRecords * 3 / 5
	for b := range int64(3) {
		offs := make([]int64, perBatch)
		for i := range offs {
			offs[i] = b*perBatch + int64(i)
		}
		batches = append(batches, data(b*perBatch, -1, false, offs...))
	}
	got, err := filterPartition("t", part(3*perBatch, nil, batches...), 0, true, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.chunks) != 2 || len(got.chunks[0]) != 2*perBatch || got.n != 3*perBatch || got.next != 3*perBatch {
		t.Fatalf("%d chunks, n %d, next %d: want 2 chunks (the first of 2 batches), n %d, next %d", len(got.chunks), got.n, got.next, 3*perBatch, 3*perBatch)
	}
	for i, r := range got.all() {
		if r.Offset != int64(i) {
			t.Fatalf("record %d at offset %d", i, r.Offset)
		}
	}
}

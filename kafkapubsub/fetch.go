package kafkapubsub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// Isolation says which records of transactional producers the Subscriber
// delivers.
type Isolation int8

const (
	// ReadCommitted delivers only records of committed transactions (and
	// records written outside transactions), up to the last stable offset.
	ReadCommitted Isolation = 1
	// ReadUncommitted delivers every data record as soon as it is written,
	// including records of transactions that are later aborted or still open.
	ReadUncommitted Isolation = 2
)

// abortMarker is the type of the control record that ends an aborted
// transaction (a commit marker has type 1).
const abortMarker = 0

// fetcher reads one partition with Fetch requests sent over a kafka-go
// Transport. kafka-go's own readers do not filter aborted transactions, and
// its Client.Fetch drops the response's aborted-transaction list, so the
// response is filtered here as the Java consumer's CompletedFetch does.
type fetcher struct {
	transport *kafka.Transport
	addr      net.Addr
	topic     string
	partition int
	committed bool
	maxBytes  int
	maxWait   time.Duration
	// last is how many records the last fetch returned: the room the next
	// one's records are given at once (up to chunkRecords).
	last int
}

// fetched is what one Fetch response yields: the records to deliver, in
// offset order, and the position after the response. Every offset below next
// that is not in records is hidden (a control record, a record of an aborted
// transaction, a record removed by compaction) and may be committed past.
type fetched struct {
	// chunks are the records, about chunkRecords at a time (a record batch
	// is never split), n of them.
	chunks [][]kafka.Message
	n      int
	next   int64
}

// fetch reads from pos.
func (f *fetcher) fetch(ctx context.Context, pos int64) (fetched, error) {
	isolation := int8(0)
	if f.committed {
		isolation = 1
	}
	ctx, cancel := context.WithTimeout(ctx, f.maxWait+30*time.Second)
	defer cancel()
	m, err := f.transport.RoundTrip(ctx, f.addr, &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(f.maxWait / time.Millisecond),
		MinBytes:       1,
		MaxBytes:       int32(f.maxBytes),
		IsolationLevel: isolation,
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetchapi.RequestTopic{{
			Topic: f.topic,
			Partitions: []fetchapi.RequestPartition{{
				Partition:          int32(f.partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        pos,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(f.maxBytes),
			}},
		}},
	})
	if err != nil {
		return fetched{next: pos}, err
	}
	res, ok := m.(*fetchapi.Response)
	if !ok {
		return fetched{next: pos}, fmt.Errorf("unexpected fetch response %T", m)
	}
	if res.ErrorCode != 0 {
		return fetched{next: pos}, kafka.Error(res.ErrorCode)
	}
	for _, t := range res.Topics {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if t.Topic != f.topic || int(p.Partition) != f.partition {
				continue
			}
			if p.ErrorCode != 0 {
				return fetched{next: pos}, kafka.Error(p.ErrorCode)
			}
			out, err := filterPartition(f.topic, p, pos, f.committed, f.last)
			f.last = out.n
			return out, err
		}
	}
	return fetched{next: pos}, fmt.Errorf("fetch response without %s/%d", f.topic, f.partition)
}

// chunkRecords is about how many records a fetch response's chunks hold.
const chunkRecords = 1024

// batch is one decoded record batch of a fetch response.
type batch struct {
	base          int64
	producerID    int64
	transactional bool
	control       bool
	abort         bool  // a control batch holding an abort marker
	maxOffset     int64 // highest record offset seen, or -1
}

// readBatch copies the data records of one batch from pos on to out, and
// returns out: kafka-go's key and value bytes are only valid until the
// next ReadRecord, so they are copied, into blocks of a (see arena).
func readBatch(topic string, partition int, rr protocol.RecordReader, a *arena, pos int64, out []kafka.Message) (batch, []kafka.Message, error) {
	b := batch{producerID: -1, maxOffset: -1}
	switch v := rr.(type) {
	case *protocol.RecordBatch:
		b.base, b.producerID, b.transactional = v.BaseOffset, v.ProducerID, v.Attributes.Transactional()
	case *protocol.ControlBatch:
		b.base, b.producerID, b.transactional, b.control = v.BaseOffset, v.ProducerID, v.Attributes.Transactional(), true
	case *protocol.MessageSet:
		b.base = v.BaseOffset
	default:
		return b, out, fmt.Errorf("unexpected record batch %T", rr)
	}
	for {
		r, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			return b, out, nil
		}
		if err != nil {
			return b, out, err
		}
		b.maxOffset = max(b.maxOffset, r.Offset)
		if b.control {
			cr, err := protocol.ReadControlRecord(r)
			if err != nil {
				return b, out, fmt.Errorf("control record at offset %d: %w", r.Offset, err)
			}
			if cr.Type == abortMarker {
				b.abort = true
			}
			continue
		}
		if r.Offset < pos { // a fetch may start in the middle of a batch
			closeBytes(r.Key)
			closeBytes(r.Value)
			continue
		}
		key, err := a.read(r.Key)
		if err != nil {
			return b, out, fmt.Errorf("key at offset %d: %w", r.Offset, err)
		}
		value, err := a.read(r.Value)
		if err != nil {
			return b, out, fmt.Errorf("value at offset %d: %w", r.Offset, err)
		}
		closeBytes(r.Key)
		closeBytes(r.Value)
		var headers []kafka.Header
		if len(r.Headers) > 0 {
			headers = append(headers, r.Headers...)
		}
		out = append(out, kafka.Message{
			Topic: topic, Partition: partition, Offset: r.Offset,
			Key: key, Value: value, Headers: headers, Time: r.Time,
		})
	}
}

// arena hands out the bytes of the keys and values of a fetch response's
// records from blocks of arenaBlock bytes, one allocation for many
// records; a larger key or value gets one of its own. Each slice it hands
// out is capped at its length, so that appending to one never writes into
// the next.
type arena struct{ free []byte }

// arenaBlock is the size of an arena's blocks: a message kept by its
// handler keeps at most that much memory of other records alive.
const arenaBlock = 16 << 10

// read copies b (nil for a null key or value) out of the response.
func (a *arena) read(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	n := b.Len()
	var s []byte
	switch {
	case n == 0:
		return []byte{}, nil
	case n > arenaBlock/4:
		s = make([]byte, n)
	default:
		if len(a.free) < n {
			a.free = make([]byte, arenaBlock)
		}
		s, a.free = a.free[:n:n], a.free[n:]
	}
	_, err := io.ReadFull(b, s)
	return s, err
}

func closeBytes(b protocol.Bytes) {
	if b != nil {
		_ = b.Close()
	}
}

// filterPartition turns one partition of a fetch response read from pos into
// the records to deliver and the next position, hiding control records, and
// (under read committed) records of aborted transactions and anything at or
// past the last stable offset. The aborted-transaction state lives only for
// this response: the broker lists every aborted transaction overlapping the
// returned range, even one whose first offset is below pos.
//
// The records are given room for sizeHint of them at once (up to
// chunkRecords), and cut in chunks of about chunkRecords between record
// batches: a response of many records grows no slice of them all.
func filterPartition(topic string, p *fetchapi.ResponsePartition, pos int64, committed bool, sizeHint int) (out fetched, err error) {
	out = fetched{next: pos}
	var cur []kafka.Message // the chunk being filled
	defer func() {
		if len(cur) > 0 {
			out.chunks = append(out.chunks, cur)
			out.n += len(cur)
		}
	}()
	stream, ok := p.RecordSet.Records.(*protocol.RecordStream)
	if p.RecordSet.Records == nil {
		return out, nil
	}
	var batches []protocol.RecordReader
	if ok {
		batches = stream.Records
	} else {
		batches = []protocol.RecordReader{p.RecordSet.Records}
	}
	aborted := append([]fetchapi.ResponseTransaction(nil), p.AbortedTransactions...)
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	abortedProducers := map[int64]bool{}
	limit := int64(-1) // no limit
	if committed && p.LastStableOffset >= 0 {
		limit = p.LastStableOffset
	}
	decoded := 0
	var a arena
	for _, rr := range batches {
		if len(cur) >= chunkRecords {
			out.chunks = append(out.chunks, cur)
			out.n += len(cur)
			cur = nil
		}
		if cur == nil && sizeHint > 0 {
			cur = make([]kafka.Message, 0, min(sizeHint, chunkRecords))
		}
		kept := len(cur)
		b, records, err := readBatch(topic, int(p.Partition), rr, &a, pos, cur)
		cur = records
		if err != nil {
			cur = cur[:kept]
			// Deliver what came before; the next fetch starts at the bad batch.
			if out.n+len(cur) > 0 || out.next > pos {
				return out, nil
			}
			return out, err
		}
		if limit >= 0 && b.base >= limit {
			cur = cur[:kept]
			break // at or past the last stable offset: not yet decided
		}
		decoded++
		// kafka-go drops each batch's last offset delta: the batch ends at
		// its last record that is still there, at least at its base.
		last := max(b.base, b.maxOffset)
		hidden := b.control
		if committed && b.producerID >= 0 {
			for len(aborted) > 0 && aborted[0].FirstOffset <= last {
				abortedProducers[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			switch {
			case b.control && b.abort:
				delete(abortedProducers, b.producerID)
			case b.transactional && abortedProducers[b.producerID]:
				hidden = true
			}
		}
		if hidden {
			cur = cur[:kept]
		} else if limit >= 0 {
			for i := kept; i < len(cur); i++ {
				if cur[i].Offset >= limit {
					cur = cur[:i]
					break
				}
			}
		}
		out.next = max(out.next, last+1)
		if limit >= 0 {
			out.next = min(out.next, max(limit, pos))
		}
	}
	if decoded > 0 && out.next == pos && out.n+len(cur) == 0 && (limit < 0 || pos < limit) {
		// The broker returns first the batch that holds pos. When nothing in
		// it is at or past pos (its tail was compacted away, or it is an
		// empty batch kept for its producer's state), pos is hidden: step
		// over it.
		out.next = pos + 1
	}
	return out, nil
}

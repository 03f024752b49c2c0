package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

// memPartition is a partition of n records held in memory, offsets 0 to
// n-1, in batches of up to batchLen, with MaxInFlight window; its messages
// are made as a transport makes them (benchMessage).
func memPartition(n, window, batchLen int) *Partition[rec] {
	batches := make(chan Batch[rec], n/batchLen+1)
	for off := 0; off < n; off += batchLen {
		recs := make([]rec, min(batchLen, n-off))
		for j := range recs {
			recs[j].Offset = int64(off + j)
		}
		batches <- Batch[rec]{Records: recs}
	}
	return &Partition[rec]{
		Config: Config{MaxInFlight: window, NackBackoff: time.Millisecond, MaxNackBackoff: time.Second,
			DrainTimeout: time.Second, Logger: slog.New(slog.DiscardHandler), Name: "test"},
		Topic: "t", Start: 0,
		Meta:    func(r *rec) (int64, []byte) { return r.Offset, r.Key },
		Prepare: func(r *rec) *message.Message { return benchMessage(r.Offset) },
		Batches: batches,
	}
}

// With MaxInFlight 1, a partition delivers each record in order, the next
// only after the ack of the one before, and a nacked one again before the
// next, and at the end commits past them all. With slow, the message is
// made slowly, so that the ack or nack of the one before has come by the
// time the loop waits for it.
func TestPartitionDeliversInOrderOneAtATime(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow=%v", slow), func(t *testing.T) {
			records := 5_000
			if slow {
				records = 300
			}
			p := memPartition(records, 1, records)
			if slow {
				p.Prepare = func(r *rec) *message.Message {
					time.Sleep(300 * time.Microsecond)
					return benchMessage(r.Offset)
				}
			}
			out := make(chan *message.Message)
			stopCtx, stop := context.WithCancel(context.Background())
			defer stop()
			var last atomic.Int64
			go p.Run(context.Background(), stopCtx, out, func(next int64) { last.Store(next) })
			nacked := map[int64]bool{}
			for want := int64(0); want < int64(records); {
				var m *message.Message
				select {
				case m = <-out:
				case <-time.After(10 * time.Second):
					t.Fatalf("offset %d not delivered", want)
				}
				src, ok := dedupe.SourceFromContext(m.Context())
				if !ok || src.Offset != want {
					t.Fatalf("delivered %+v (%v), want offset %d", src, ok, want)
				}
				select {
				case extra := <-out:
					s, _ := dedupe.SourceFromContext(extra.Context())
					t.Fatalf("offset %d delivered while %d was with the handler", s.Offset, want)
				default:
				}
				if want%7 == 3 && !nacked[want] {
					nacked[want] = true
					m.Nack()
					continue
				}
				m.Ack()
				want++
			}
			deadline := time.Now().Add(5 * time.Second)
			for last.Load() != int64(records) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := last.Load(); got != int64(records) {
				t.Fatalf("committed up to %d, want %d", got, records)
			}
		})
	}
}

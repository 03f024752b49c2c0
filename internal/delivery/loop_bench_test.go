package delivery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/cputime"
)

// The loop's own cost per message, without a transport: partitions of
// records held in memory, delivered through one channel to one goroutine
// that acks each message as it arrives (as the transports' Subscribe
// benchmarks do), with MaxInFlight 1 and 64:
//
//	go test -run '^$' -bench Partition -benchmem ./internal/delivery
//
// ns/op, cpu-ns/msg (the process's CPU time, both cores) and allocs/op
// are per message; each message is made as a transport makes one
// (Watermill's NewMessage and its offset's metadata). Beside them, the
// floors: one goroutine that makes each message and hands it over, and the
// same waiting for each message's ack before it makes the next, as
// MaxInFlight 1 must.
func BenchmarkPartition(b *testing.B) {
	// The floor: one goroutine makes each message and hands it over the
	// channel, never waiting for its ack.
	for _, waits := range []bool{false, true} {
		b.Run(fmt.Sprintf("floor/waits=%v", waits), func(b *testing.B) {
			out := make(chan *message.Message)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			defer func() { reportCPU(b, cpu) }()
			go func() {
				for i := range b.N {
					m := message.NewMessage("", nil)
					m.Metadata["offset"] = strconv.FormatInt(int64(i), 10)
					out <- m
					if waits {
						<-m.Acked()
					}
				}
			}()
			for range b.N {
				(<-out).Ack()
			}
		})
	}
	for _, parts := range []int{1, 4} {
		for _, window := range []int{1, 64} {
			b.Run(fmt.Sprintf("partitions=%d/inflight=%d", parts, window), func(b *testing.B) {
				benchPartitions(b, parts, window)
			})
		}
	}
}

func benchPartitions(b *testing.B, parts, window int) {
	const batchLen = 500
	cfg := Config{MaxInFlight: window, NackBackoff: time.Millisecond, MaxNackBackoff: time.Second,
		DrainTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Name: "bench"}
	ps := make([]*Partition[rec], parts)
	for i := range ps {
		per := b.N / parts
		if i < b.N%parts {
			per++
		}
		batches := make(chan Batch[rec], per/batchLen+1)
		for off := 0; off < per; off += batchLen {
			recs := make([]rec, min(batchLen, per-off))
			for j := range recs {
				recs[j].Offset = int64(off + j)
			}
			batches <- Batch[rec]{Records: recs}
		}
		ps[i] = &Partition[rec]{Config: cfg, Topic: "bench", Partition: int32(i), Start: 0,
			Meta: func(r *rec) (int64, []byte) { return r.Offset, r.Key },
			Prepare: func(r *rec) *message.Message {
				m := message.NewMessage("", nil)
				m.Metadata["offset"] = strconv.FormatInt(r.Offset, 10)
				return m
			},
			Batches: batches}
	}
	out := make(chan *message.Message)
	stopCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Process()
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(context.Background(), stopCtx, out, func(int64) {})
		}()
	}
	for range b.N {
		(<-out).Ack()
	}
	reportCPU(b, cpu)
	b.StopTimer()
	stop()
	wg.Wait()
}

// reportCPU reports the process's CPU time since cpu per message.
func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/msg")
}

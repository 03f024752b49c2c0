package delivery

import (
	"context"
	"fmt"
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
					m := benchMessage(int64(i))
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
	ps := make([]*Partition[rec], parts)
	for i := range ps {
		per := b.N / parts
		if i < b.N%parts {
			per++
		}
		ps[i] = memPartition(per, window, 500)
		ps[i].Partition = int32(i)
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

// benchMessage makes the message of the record at offset as a transport
// makes one: Watermill's NewMessage and the offset's metadata.
func benchMessage(offset int64) *message.Message {
	m := message.NewMessage("", nil)
	m.Metadata["offset"] = strconv.FormatInt(offset, 10)
	return m
}

// reportCPU reports the process's CPU time since cpu per message.
func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/msg")
}

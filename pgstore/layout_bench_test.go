package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/cputime"
	"github.com/exactly-go/exactly/pgstore"
)

// benchID is a new message ID of kind: "v7" a UUIDv7, else a random UUID.
func benchID(kind string) string {
	if kind == "v7" {
		return uuid.Must(uuid.NewV7()).String()
	}
	return uuid.NewString()
}

// BenchmarkDoBatch claims batches of 500 new keys, each with its source
// as a consumer's are, with a function that does nothing, on each layout,
// with random and time-ordered IDs: the claim's own cost. cpu-ns/key is this process's CPU time (the library's
// side of the claim: its arguments, their encoding, the answer's decoding)
// per key. Run:
//
//	go test -run '^$' -bench DoBatch -benchtime 40x ./pgstore
func BenchmarkDoBatch(b *testing.B) {
	const size = 500
	for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
		for _, ids := range []string{"v4", "v7"} {
			b.Run(fmt.Sprintf("%s/%s", layout, ids), func(b *testing.B) {
				s := storeMakers[layout]
				store, _ := s(b, nil)
				ctx := context.Background()
				reqs := make([]dedupe.Request, size)
				var cpu time.Duration
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					for i := range reqs {
						id := benchID(ids)
						reqs[i] = dedupetest.Req("bench", id, id)
						reqs[i].Source = dedupe.Source{Topic: "bench-topic", Partition: int32(i % 6), Offset: int64(i)}
					}
					b.StartTimer()
					at := cputime.Process()
					if _, err := store.DoBatch(ctx, reqs, func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil }); err != nil {
						b.Fatal(err)
					}
					cpu += cputime.Process() - at
				}
				b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "keys/s")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(size*b.N), "cpu-ns/key")
			})
		}
	}
}

// BenchmarkDo claims one new key per transaction (Do with a function that
// does nothing), on each layout, with random and time-ordered IDs, from 4
// goroutines. Run:
//
//	go test -run '^$' -bench 'Do$' -benchtime 2000x ./pgstore
func BenchmarkDo(b *testing.B) {
	for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
		for _, ids := range []string{"v4", "v7"} {
			b.Run(fmt.Sprintf("%s/%s", layout, ids), func(b *testing.B) {
				store, _ := storeMakers[layout](b, nil)
				ctx := context.Background()
				b.SetParallelism(2)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := benchID(ids)
						req := dedupetest.Req("bench", id, id)
						req.Source = dedupe.Source{Topic: "bench-topic", Partition: 3, Offset: 7}
						if _, err := store.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
							b.Fatal(err)
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
			})
		}
	}
}

// BenchmarkDoRatio is BenchmarkDo on both layouts at once, side by side:
// each of 4 goroutines claims one new key on the single table and one on
// the partitioned layout per iteration (in turn first), so that both see
// the same load, and the benchmark reports the partitioned layout's claim
// rate over the single table's (x-single; the target is at least 0.9 for
// time-ordered IDs). Run:
//
//	go test -run '^$' -bench DoRatio -count 3 -benchtime 3000x ./pgstore
func BenchmarkDoRatio(b *testing.B) {
	for _, ids := range []string{"v4", "v7"} {
		b.Run(ids, func(b *testing.B) {
			single, _ := storeMakers[pgstore.LayoutSingleTable](b, nil)
			part, _ := storeMakers[pgstore.LayoutPartitioned](b, nil)
			ctx := context.Background()
			claim := func(s *pgstore.Store, ns *atomic.Int64) {
				id := benchID(ids)
				req := dedupetest.Req("bench", id, id)
				req.Source = dedupe.Source{Topic: "bench-topic", Partition: 3, Offset: 7}
				start := time.Now()
				if c, err := s.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil || c.Decision != dedupe.DecisionNew {
					b.Fatal(c.Decision, err)
				}
				ns.Add(int64(time.Since(start)))
			}
			// Warm up: each connection prepares its statements.
			for range 20 {
				claim(single, new(atomic.Int64))
				claim(part, new(atomic.Int64))
			}
			var singleNs, partNs atomic.Int64
			var turn atomic.Int64
			b.SetParallelism(2)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if turn.Add(1)%2 == 0 {
						claim(single, &singleNs)
						claim(part, &partNs)
					} else {
						claim(part, &partNs)
						claim(single, &singleNs)
					}
				}
			})
			b.ReportMetric(float64(singleNs.Load())/float64(partNs.Load()), "x-single")
			b.ReportMetric(float64(singleNs.Load())/float64(b.N), "single-ns/claim")
			b.ReportMetric(float64(partNs.Load())/float64(b.N), "partitioned-ns/claim")
		})
	}
}

package pgstore_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// retriesKey holds, in a claim's ctx, the count of its transaction's retries.
type retriesKey struct{}

// retryCounter is a log handler that counts, in the claim's ctx, the
// store's "retrying transaction" records: a claim of a key whose partition
// was dropped meanwhile is retried.
type retryCounter struct{}

func (retryCounter) Enabled(context.Context, slog.Level) bool { return true }
func (retryCounter) Handle(ctx context.Context, r slog.Record) error {
	if n, ok := ctx.Value(retriesKey{}).(*atomic.Int64); ok && strings.HasPrefix(r.Message, "pgstore: retrying") {
		n.Add(1)
	}
	return nil
}
func (h retryCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h retryCounter) WithGroup(string) slog.Handler      { return h }

// BenchmarkClaimDuringMaintenance measures how long claims of UUIDv7 keys
// take on the partitioned layout while partition maintenance runs every
// 200 ms (partitions 1 s wide: one is created ahead and one retired every
// second), beside the same claims with no maintenance: compare the max-ms
// and p99-ms metrics of the two sub-benchmarks of one run (under 2 minutes
// each: the partitions are created 120 s ahead). max-ms-unretried leaves
// out the claims that were retried (retried-claims): with keys that expire
// at once, an ID minted in the last moment of a second can find its
// partition dropped before its claim, and is claimed again in the other
// partition after a back-off, as any claim of an ID older than the TTL.
//
//	go test -run '^$' -bench ClaimDuringMaintenance -benchtime 20s ./pgstore
func BenchmarkClaimDuringMaintenance(b *testing.B) {
	for _, maint := range []bool{false, true} {
		name := "quiet"
		if maint {
			name = "maintenance"
		}
		b.Run(name, func(b *testing.B) {
			s, _, db := newPartitioned(b, &pgstore.Config{PartitionsAhead: 120}, "1 second")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := s.Check(ctx); err != nil {
				b.Fatal(err)
			}
			claimer, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned,
				Logger: slog.New(retryCounter{})})
			if err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			runs := 0
			low := func() time.Time {
				var t time.Time
				if err := db.Pool.QueryRow(context.Background(), "SELECT low FROM "+db.Table("exactly_keys2_state")).Scan(&t); err != nil {
					b.Fatal(err)
				}
				return t
			}
			before := low()
			if maint {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if _, err := s.Cleanup(ctx, nil); err == nil {
							runs++
						}
						select {
						case <-ctx.Done():
						case <-time.After(200 * time.Millisecond):
						}
					}
				}()
			}
			var mu sync.Mutex
			var lat, unretried []time.Duration
			var retried atomic.Int64
			b.ResetTimer()
			b.SetParallelism(2)
			b.RunParallel(func(pb *testing.PB) {
				var mine, once []time.Duration
				for pb.Next() {
					var retries atomic.Int64
					// Keys expire at once, so each partition is retired as
					// soon as its second is past.
					req := dedupetest.Req("s", uuid.Must(uuid.NewV7()).String(), "p")
					req.TTL = time.Millisecond
					start := time.Now()
					if _, err := claimer.Do(context.WithValue(ctx, retriesKey{}, &retries), req, noop); err != nil && ctx.Err() == nil {
						b.Error(err)
					}
					mine = append(mine, time.Since(start))
					if retries.Load() == 0 {
						once = append(once, time.Since(start))
					} else {
						retried.Add(1)
					}
				}
				mu.Lock()
				lat, unretried = append(lat, mine...), append(unretried, once...)
				mu.Unlock()
			})
			b.StopTimer()
			cancel()
			wg.Wait()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			}
			slices.Sort(unretried)
			if len(unretried) > 0 {
				b.ReportMetric(float64(unretried[len(unretried)-1].Microseconds())/1000, "max-ms-unretried")
			}
			b.ReportMetric(float64(retried.Load()), "retried-claims")
			b.ReportMetric(float64(runs), "maintenance-runs")
			b.ReportMetric(low().Sub(before).Seconds(), "partitions-dropped")
		})
	}
}

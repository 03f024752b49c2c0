package pgstore

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// Stats past statsExactMax keys on both layouts estimates the counts, and
// on the partitioned layout keeps answering while maintenance creates and
// retires partitions under it.
func TestStatsPastExactMax(t *testing.T) {
	t.Parallel()
	const keys, processing = statsExactMax + 10_000, 6_000
	for _, tc := range []struct {
		layout Layout
		probed bool // the partitioned layout's keys are in the legacy table it probes
	}{{LayoutSingleTable, false}, {LayoutPartitioned, false}, {LayoutPartitioned, true}} {
		layout := tc.layout
		name := layout.String()
		if tc.probed {
			name += "/legacy-probed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if layout == LayoutPartitioned {
				if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys2_state")+" SET width = '1 second'"); err != nil {
					t.Fatal(err)
				}
			}
			s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: layout, PartitionsAhead: 2, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.probed {
				// Check would retire and drop the empty single table;
				// the clean-up before the start leaves it alone.
				if _, err := s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1}); err != nil {
					t.Fatal(err)
				}
			} else if err := s.Check(ctx); err != nil {
				t.Fatal(err)
			}
			fill := "INSERT INTO " + db.Table("exactly_keys") + ` (scope, key, fingerprint, status, locked_until, created_at, expires_at)
				SELECT 's', 'k' || g, repeat('a', 64), CASE WHEN g <= $2 THEN 'PROCESSING' ELSE 'COMPLETED' END,
				       CASE WHEN g <= $2 THEN now() + interval '1 hour' END, now(), now() + interval '1 day'
				FROM generate_series(1, $1) g`
			if tc.probed {
				// The legacy keys stand for keys written before the switch,
				// which the guard on exactly_keys refuses once it started.
				if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys2_state")+" SET legacy = 'exactly_keys'; "+
					"ALTER TABLE "+db.Table("exactly_keys")+" DISABLE TRIGGER exactly_keys_legacy_guard"); err != nil {
					t.Fatal(err)
				}
				s.part().forget()
				if _, err := db.Pool.Exec(ctx, "ANALYZE "+db.Table("exactly_keys")); err != nil {
					t.Fatal(err)
				}
			} else if layout == LayoutPartitioned {
				if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("exactly_key_names")+" (name) VALUES ('s')"); err != nil {
					t.Fatal(err)
				}
				fill = "INSERT INTO " + db.Table("exactly_keys2") + ` (kid, created_at, expires_at, locked_until, scope, attempts, kind, status, fingerprint)
					SELECT ('4' || substr(md5(g::text), 2))::uuid, now(), now() + interval '1 day', CASE WHEN g <= $2 THEN now() + interval '1 hour' END,
					       (SELECT code FROM ` + db.Table("exactly_key_names") + ` WHERE name = 's'), 1, 'u',
					       CASE WHEN g <= $2 THEN 'P' ELSE 'C' END::"char", sha256('p')
					FROM generate_series(1, $1) g`
			}
			if _, err := db.Pool.Exec(ctx, fill, keys, processing); err != nil {
				t.Fatal(err)
			}
			analyze := "ANALYZE " + s.table
			if tc.probed {
				analyze += ", " + db.Table("exactly_keys")
			}
			if _, err := db.Pool.Exec(ctx, analyze); err != nil {
				t.Fatal(err)
			}
			check := func() {
				st, err := s.Stats(ctx)
				if err != nil {
					t.Errorf("stats of %d keys: %v", keys, err)
					return
				}
				if !st.Estimated || st.Processing+st.Completed < keys*95/100 || st.Processing+st.Completed > keys*105/100 || st.TableBytes <= 0 {
					t.Errorf("stats %+v; want about %d keys, estimated", st, keys)
				}
			}
			check()
			if layout != LayoutPartitioned {
				return
			}
			// Maintenance on 1-second partitions creates one and retires one
			// about every second while Stats runs.
			var wg sync.WaitGroup
			stop := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = s.Cleanup(ctx, nil)
				}
			}()
			var low0 time.Time
			if err := db.Pool.QueryRow(ctx, "SELECT low FROM "+s.part().state).Scan(&low0); err != nil {
				t.Fatal(err)
			}
			for {
				check()
				var low time.Time
				if err := db.Pool.QueryRow(ctx, "SELECT low FROM "+s.part().state).Scan(&low); err != nil {
					t.Fatal(err)
				}
				if low.Sub(low0) >= 3*time.Second || t.Failed() || ctx.Err() != nil {
					break
				}
			}
			close(stop)
			wg.Wait()
		})
	}
}

package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// Two members claim and save overlapping sets of 64 partitions at once, on
// every exec mode: no deadlock, no error; afterwards the last claimer saves
// every partition and the other's saves are all lost.
func TestClaimsConcurrentMembers(t *testing.T) {
	for _, mode := range execModes {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			cfg, err := pgtest.Config(pgtest.RequireURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 8
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			p, err := pgstore.NewPositions(pool, &pgstore.PositionsConfig{Schema: db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			const n = 64
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for m := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(m), 7))
					var epochs map[int]int64
					off := int64(0)
					for range 60 {
						parts := r.Perm(n)[:1+r.IntN(n)]
						if r.IntN(3) == 0 {
							var err error
							if _, epochs, err = p.Claim(ctx, "g", "t", parts); err != nil {
								errs <- fmt.Errorf("member %d: claim: %w", m, err)
								return
							}
							continue
						}
						off++
						offs := map[int]int64{}
						for _, part := range parts {
							offs[part] = off
						}
						if _, _, err := p.SaveClaimed(ctx, "g", "t", offs, nil, epochs); err != nil {
							errs <- fmt.Errorf("member %d: save: %w", m, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			all := make([]int, n)
			for i := range all {
				all[i] = i
			}
			_, old, err := p.Claim(ctx, "g", "t", all)
			if err != nil {
				t.Fatal(err)
			}
			_, mine, err := p.Claim(ctx, "g", "t", all)
			if err != nil {
				t.Fatal(err)
			}
			offs := map[int]int64{}
			for _, part := range all {
				offs[part] = 1000
			}
			if _, lost, err := p.SaveClaimed(ctx, "g", "t", offs, nil, mine); err != nil || lost != nil {
				t.Fatalf("the last claimer's save: lost %v, %v", lost, err)
			}
			for _, part := range all {
				offs[part] = 2000
			}
			_, lost, err := p.SaveClaimed(ctx, "g", "t", offs, nil, old)
			if err != nil || !slices.Equal(lost, all) {
				t.Fatalf("the former claimer's save: lost %v, %v; want every partition", lost, err)
			}
			got, err := p.Load(ctx, "g", "t", all)
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range all {
				if got[part] != 1000 {
					t.Fatalf("partition %d at %d, want 1000", part, got[part])
				}
			}
		})
	}
}

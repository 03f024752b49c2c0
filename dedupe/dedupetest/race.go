package dedupetest

// The race: many workers claim the same keys at once.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// testRace: many workers, each in its own transactions, claim the same keys
// in random order; a tenth of the transactions roll back after applying.
// Every key must end applied exactly once.
func testRace[TX any](t *testing.T, h Harness[TX]) {
	workers, keys := h.RaceWorkers, h.RaceKeys
	if workers == 0 {
		workers = 32
	}
	if keys == 0 {
		keys = 500
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := rand.Perm(keys)
			for _, k := range order {
				if err := raceOnce(ctx, h, k); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := 0; k < keys; k++ {
		mustApplied(t, h, dedupe.Key{Scope: "race", ID: fmt.Sprint(k)}, 1)
	}
	st, err := h.Store.Stats(ctx)
	if err != nil || st.Completed != int64(keys) {
		t.Fatalf("stats after race %+v %v, want %d completed", st, err, keys)
	}
}

func raceOnce[TX any](ctx context.Context, h Harness[TX], k int) error {
	for attempt := 0; ; attempt++ {
		err := raceTx(ctx, h, k)
		if err == nil || !dedupe.IsRetryable(err) || attempt == 20 {
			return err
		}
	}
}

func raceTx[TX any](ctx context.Context, h Harness[TX], k int) error {
	req := Req("race", fmt.Sprint(k), fmt.Sprintf(`{"k":%d}`, k))
	tx, err := h.Begin(ctx)
	if err != nil {
		return err
	}
	defer h.Rollback(context.WithoutCancel(ctx), tx)
	c, err := h.Store.ClaimTx(ctx, tx, req)
	if err != nil {
		return fmt.Errorf("claim %s: %w", req.Key, err)
	}
	if !c.Decision.Run() {
		return h.Commit(ctx, tx)
	}
	if err := h.Apply(ctx, tx, req.Key.String()); err != nil {
		return err
	}
	if err := h.Store.CompleteTx(ctx, tx, c, []byte("ok")); err != nil {
		return err
	}
	if rand.IntN(10) == 0 {
		return h.Rollback(ctx, tx)
	}
	return h.Commit(ctx, tx)
}

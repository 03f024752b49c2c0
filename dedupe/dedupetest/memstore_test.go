package dedupetest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/exactly-go/exactly/dedupe/dedupetest"
)

func TestMemStore(t *testing.T) {
	dedupetest.Exercise(t, func(t *testing.T) dedupetest.Harness[*dedupetest.MemTx] {
		s := dedupetest.NewMemStore()
		s.MaxResultBytes = 1024
		var mu sync.Mutex
		applied := map[string]int{}
		return dedupetest.Harness[*dedupetest.MemTx]{
			Store:          s,
			Begin:          s.Begin,
			Commit:         func(ctx context.Context, tx *dedupetest.MemTx) error { return tx.Commit(ctx) },
			Rollback:       func(ctx context.Context, tx *dedupetest.MemTx) error { return tx.Rollback(ctx) },
			MaxResultBytes: 1024,
			Apply: func(_ context.Context, tx *dedupetest.MemTx, id string) error {
				tx.OnCommit(func() { mu.Lock(); applied[id]++; mu.Unlock() })
				return nil
			},
			Applied: func(_ context.Context, id string) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return applied[id], nil
			},
		}
	})
}

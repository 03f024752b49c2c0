package dedupetest

// The store's upkeep: Cleanup of expired keys, and Stats.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

func testCleanup[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	const expiring, keep = 25, 10
	for i := 0; i < expiring; i++ {
		r := Req("s", fmt.Sprintf("old-%d", i), "p")
		r.TTL = time.Millisecond
		if _, err := Do(ctx, h, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < keep; i++ {
		if _, err := Do(ctx, h, Req("s", fmt.Sprintf("new-%d", i), "p"), nil); err != nil {
			t.Fatal(err)
		}
	}
	// A leased key past its TTL but within its lease is kept.
	leased := Req("s", "leased", "p")
	leased.TTL = time.Millisecond
	if _, err := h.Store.Acquire(ctx, leased, time.Hour); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keys to expire", 10*time.Second, func() bool {
		st, err := h.Store.Stats(ctx)
		return err == nil && st.Expired == expiring+1
	})
	n, err := h.Store.Cleanup(ctx, &dedupe.CleanupConfig{BatchSize: 7})
	if err != nil || n != expiring {
		t.Fatalf("Cleanup = %d, %v, want %d", n, err, expiring)
	}
	for i := 0; i < keep; i++ {
		if _, err := h.Store.Get(ctx, dedupe.Key{Scope: "s", ID: fmt.Sprintf("new-%d", i)}); err != nil {
			t.Fatalf("cleanup deleted a live key: %v", err)
		}
	}
	if _, err := h.Store.Get(ctx, dedupe.Key{Scope: "s", ID: "old-3"}); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("expired key kept: %v", err)
	}
	if _, err := h.Store.Get(ctx, leased.Key); err != nil {
		t.Fatalf("cleanup deleted a key under a valid lease: %v", err)
	}
	if n, err := h.Store.Cleanup(ctx, nil); err != nil || n != 0 {
		t.Fatalf("second Cleanup = %d, %v, want 0", n, err)
	}
}

func testStats[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	st, err := h.Store.Stats(ctx)
	if err != nil || st.Completed != 0 || st.Processing != 0 || !st.Oldest.IsZero() {
		t.Fatalf("empty store stats %+v %v", st, err)
	}
	for i := 0; i < 3; i++ {
		if _, err := Do(ctx, h, Req("s", fmt.Sprint(i), "p"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.Store.Acquire(ctx, Req("s", "leased", "p"), time.Hour); err != nil {
		t.Fatal(err)
	}
	st, err = h.Store.Stats(ctx)
	if err != nil || st.Completed != 3 || st.Processing != 1 || st.Oldest.IsZero() || st.Expired != 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
}

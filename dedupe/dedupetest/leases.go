package dedupetest

// Leases: a claim held outside a transaction (Acquire), taken over once it
// expires, released early, and seen by transactional claims.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

func testLease[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	req := Req("s", "m-1", "p")
	// Long enough for the second Acquire to find the lease valid on a
	// loaded machine; the takeover below waits it out.
	const lease = 2 * time.Second
	c1, err := h.Store.Acquire(ctx, req, lease)
	if err != nil || c1.Decision != dedupe.DecisionNew || c1.Record.Status != dedupe.StatusProcessing || c1.Record.Attempts != 1 {
		t.Fatalf("acquire: %+v %v", c1, err)
	}
	_, err = h.Store.Acquire(ctx, req, lease)
	var inflight *dedupe.InFlightError
	if !errors.As(err, &inflight) || !dedupe.IsRetryable(err) || dedupe.IsPermanent(err) {
		t.Fatalf("second acquire err = %v, want retryable *InFlightError", err)
	}
	if inflight.LockedUntil.IsZero() || inflight.Attempts != 1 {
		t.Fatalf("InFlightError = %+v", inflight)
	}
	// The worker "crashes": the lease runs out and the next delivery takes over.
	var c2 dedupe.Claim
	waitFor(t, "lease takeover", 10*lease, func() bool {
		c2, err = h.Store.Acquire(ctx, req, time.Minute)
		return err == nil
	})
	if c2.Decision != dedupe.DecisionTakeover || c2.Record.Attempts != 2 {
		t.Fatalf("takeover: decision %v attempts %d", c2.Decision, c2.Record.Attempts)
	}
	// The crashed worker wakes up: it no longer owns the key.
	if err := h.Store.Complete(ctx, c1, []byte("stale")); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("stale Complete err = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Release(ctx, c1); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("stale Release err = %v, want ErrLeaseLost", err)
	}
	if err := h.Store.Complete(ctx, c2, []byte("done")); err != nil {
		t.Fatal(err)
	}
	c3, err := h.Store.Acquire(ctx, req, lease)
	if err != nil || c3.Decision != dedupe.DecisionDuplicate || string(c3.Record.Result) != "done" {
		t.Fatalf("after complete: %v %q %v, want duplicate", c3.Decision, c3.Record.Result, err)
	}
	if _, err := h.Store.Acquire(ctx, Req("s", "m-1", "other"), lease); !errors.Is(err, dedupe.ErrKeyReused) {
		t.Fatalf("lease-mode key reuse err = %v", err)
	}
	if err := h.Store.Complete(ctx, c2, nil); !errors.Is(err, dedupe.ErrLeaseLost) {
		t.Fatalf("second Complete err = %v, want ErrLeaseLost", err)
	}
}

func testLeaseRelease[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	req := Req("s", "m-1", "p")
	c1, err := h.Store.Acquire(ctx, req, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Release(ctx, c1); err != nil {
		t.Fatal(err)
	}
	c2, err := h.Store.Acquire(ctx, req, time.Hour)
	if err != nil || c2.Decision != dedupe.DecisionTakeover || c2.Record.Attempts != 2 {
		t.Fatalf("after release: %v attempts %d %v, want takeover 2", c2.Decision, c2.Record.Attempts, err)
	}
	if err := h.Store.Complete(ctx, c2, nil); err != nil {
		t.Fatal(err)
	}
	rec, err := h.Store.Get(ctx, req.Key)
	if err != nil || rec.Status != dedupe.StatusCompleted || rec.Attempts != 2 {
		t.Fatalf("record %+v %v", rec, err)
	}
	// Complete keeps the key for the request's TTL, as the claim does.
	long := Req("s", "m-ttl", "p")
	long.TTL = 30 * dedupe.DefaultTTL
	c, err := h.Store.Acquire(ctx, long, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Complete(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	rec, err = h.Store.Get(ctx, long.Key)
	if err != nil || rec.ExpiresAt.Before(time.Now().Add(29*dedupe.DefaultTTL)) {
		t.Fatalf("completed with Request.TTL %v: expires at %v (%v), want about 30 × DefaultTTL from now", long.TTL, rec.ExpiresAt, err)
	}
}

func testLeaseVsTx[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	req := Req("s", "m-1", "p")
	if _, err := h.Store.Acquire(ctx, req, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := Do(ctx, h, req, nil); !errors.Is(err, dedupe.ErrInFlight) {
		t.Fatalf("claim of a leased key err = %v, want ErrInFlight", err)
	}
	mustApplied(t, h, req.Key, 0)
}

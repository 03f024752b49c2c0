// Package dedupetest holds test helpers for dedupe: Exercise, the
// conformance suite that every dedupe.Store passes, and MemStore, an
// in-memory Store for unit tests.
package dedupetest

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// Harness is what Exercise needs to drive a Store: the store, its
// transactions, and a transactional effect whose applications it can count.
type Harness[TX any] struct {
	Store    dedupe.Store[TX]
	Begin    func(ctx context.Context) (TX, error)
	Commit   func(ctx context.Context, tx TX) error
	Rollback func(ctx context.Context, tx TX) error
	// Apply records one application of id's effect in tx.
	Apply func(ctx context.Context, tx TX, id string) error
	// Applied counts the committed applications of id's effect.
	Applied func(ctx context.Context, id string) (int, error)
	// MaxResultBytes is the store's limit on results.
	MaxResultBytes int
	// RaceWorkers and RaceKeys size the race test. Default to 32 and 500.
	RaceWorkers, RaceKeys int
}

// Exercise runs the conformance suite against stores made by newHarness,
// one fresh store per subtest.
func Exercise[TX any](t *testing.T, newHarness func(t *testing.T) Harness[TX]) {
	t.Helper()
	run := func(name string, f func(t *testing.T, h Harness[TX])) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newHarness(t))
		})
	}
	run("NewThenDuplicateReturnsStoredResult", testNewThenDuplicate[TX])
	run("FingerprintMismatchIsKeyReused", testKeyReused[TX])
	run("RollbackReleasesKey", testRollbackReleases[TX])
	run("ConcurrentClaimWaitsForCommit", testConcurrentWaits[TX])
	run("ScopesAreIndependent", testScopes[TX])
	run("InvalidRequestWritesNothing", testInvalid[TX])
	run("ResultTooLarge", testResultTooLarge[TX])
	run("CancelledContext", testCancelled[TX])
	run("LeaseInFlightTakeoverComplete", testLease[TX])
	run("LeaseReleaseAllowsImmediateTakeover", testLeaseRelease[TX])
	run("LeaseHeldKeyIsInFlightForTransactions", testLeaseVsTx[TX])
	run("CleanupDeletesOnlyExpired", testCleanup[TX])
	run("Stats", testStats[TX])
	run("RaceEveryKeyAppliedOnce", testRace[TX])
}

// Req returns a request for scope/id with the fingerprint of payload.
func Req(scope, id, payload string) dedupe.Request {
	return dedupe.Request{Key: dedupe.Key{Scope: scope, ID: id}, Fingerprint: dedupe.FingerprintOf([]byte(payload))}
}

// Do runs one message through the transactional protocol: begin, claim,
// apply the effect when the claim says so, complete with result, commit.
func Do[TX any](ctx context.Context, h Harness[TX], req dedupe.Request, result []byte) (dedupe.Claim, error) {
	tx, err := h.Begin(ctx)
	if err != nil {
		return dedupe.Claim{}, err
	}
	defer h.Rollback(context.WithoutCancel(ctx), tx)
	c, err := h.Store.ClaimTx(ctx, tx, req)
	if err != nil {
		return c, err
	}
	if c.Decision.Run() {
		if err := h.Apply(ctx, tx, req.Key.String()); err != nil {
			return c, err
		}
		if err := h.Store.CompleteTx(ctx, tx, c, result); err != nil {
			return c, err
		}
	}
	return c, h.Commit(ctx, tx)
}

func mustApplied[TX any](t *testing.T, h Harness[TX], key dedupe.Key, want int) {
	t.Helper()
	n, err := h.Applied(context.Background(), key.String())
	if err != nil {
		t.Fatalf("Applied(%s): %v", key, err)
	}
	if n != want {
		t.Fatalf("%s applied %d times, want %d", key, n, want)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

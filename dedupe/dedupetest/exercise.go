// Package dedupetest holds test helpers for dedupe: Exercise, the
// conformance suite that every dedupe.Store passes, and MemStore, an
// in-memory Store for unit tests.
package dedupetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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

func testNewThenDuplicate[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	req := Req("s", "m-1", `{"amount":10}`)
	req.Source = dedupe.Source{Topic: "ledger.commands", Partition: 3, Offset: 42}
	c, err := Do(ctx, h, req, []byte("out-1"))
	if err != nil || c.Decision != dedupe.DecisionNew || c.Record.Attempts != 1 {
		t.Fatalf("first: decision %v attempts %d err %v, want new, 1, nil", c.Decision, c.Record.Attempts, err)
	}
	for i := 0; i < 3; i++ {
		c, err = Do(ctx, h, req, []byte("must not be stored"))
		if err != nil || c.Decision != dedupe.DecisionDuplicate {
			t.Fatalf("redelivery %d: decision %v err %v, want duplicate", i, c.Decision, err)
		}
		if string(c.Record.Result) != "out-1" {
			t.Fatalf("duplicate result = %q, want %q", c.Record.Result, "out-1")
		}
	}
	mustApplied(t, h, req.Key, 1)
	rec, err := h.Store.Get(ctx, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != dedupe.StatusCompleted || rec.Fingerprint != req.Fingerprint || rec.Source != req.Source ||
		rec.CompletedAt.IsZero() || !rec.ExpiresAt.After(rec.CreatedAt) || string(rec.Result) != "out-1" {
		t.Fatalf("stored record = %+v", rec)
	}
	// A nil result stores nothing, and duplicates get nil back.
	req2 := Req("s", "m-2", "x")
	if _, err := Do(ctx, h, req2, nil); err != nil {
		t.Fatal(err)
	}
	c, err = Do(ctx, h, req2, nil)
	if err != nil || c.Decision != dedupe.DecisionDuplicate || c.Record.Result != nil {
		t.Fatalf("duplicate of nil result: %v %q %v", c.Decision, c.Record.Result, err)
	}
}

func testKeyReused[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	first := Req("s", "m-1", `{"amount":10}`)
	if _, err := Do(ctx, h, first, nil); err != nil {
		t.Fatal(err)
	}
	reused := Req("s", "m-1", `{"amount":99}`)
	_, err := Do(ctx, h, reused, nil)
	var kr *dedupe.KeyReusedError
	if !errors.As(err, &kr) || !errors.Is(err, dedupe.ErrKeyReused) {
		t.Fatalf("err = %v, want *KeyReusedError", err)
	}
	if kr.Stored != first.Fingerprint || kr.Got != reused.Fingerprint || kr.Key != first.Key {
		t.Fatalf("KeyReusedError = %+v", kr)
	}
	if !dedupe.IsPermanent(err) || dedupe.IsRetryable(err) {
		t.Fatalf("key reused must be permanent, not retryable")
	}
	mustApplied(t, h, first.Key, 1)
}

func testRollbackReleases[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	req := Req("s", "m-1", "p")
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.Store.ClaimTx(ctx, tx, req)
	if err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("claim: %v %v", c.Decision, err)
	}
	if err := h.Apply(ctx, tx, req.Key.String()); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.Get(ctx, req.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("after rollback Get err = %v, want ErrNotFound", err)
	}
	mustApplied(t, h, req.Key, 0)
	c, err = Do(ctx, h, req, nil)
	if err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("redelivery after rollback: %v %v, want new", c.Decision, err)
	}
	mustApplied(t, h, req.Key, 1)
}

func testConcurrentWaits[TX any](t *testing.T, h Harness[TX]) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("firstCommits=%v", commit), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			req := Req("s", fmt.Sprintf("m-%v", commit), "p")
			tx1, err := h.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Rollback(context.Background(), tx1)
			c1, err := h.Store.ClaimTx(ctx, tx1, req)
			if err != nil || c1.Decision != dedupe.DecisionNew {
				t.Fatalf("first claim: %v %v", c1.Decision, err)
			}
			if err := h.Apply(ctx, tx1, req.Key.String()); err != nil {
				t.Fatal(err)
			}
			if err := h.Store.CompleteTx(ctx, tx1, c1, []byte("r1")); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				c   dedupe.Claim
				err error
			}
			second := make(chan answer, 1)
			go func() {
				c, err := Do(ctx, h, req, []byte("r2"))
				second <- answer{c, err}
			}()
			// The second claimer cannot decide while the first is open: were
			// it not waiting, it would see no key and answer "new" early.
			select {
			case a := <-second:
				t.Fatalf("second claim answered %v, %v while the first transaction was open", a.c.Decision, a.err)
			case <-time.After(200 * time.Millisecond):
			}
			if commit {
				err = h.Commit(ctx, tx1)
			} else {
				err = h.Rollback(ctx, tx1)
			}
			if err != nil {
				t.Fatal(err)
			}
			a := <-second
			want, wantResult := dedupe.DecisionDuplicate, "r1"
			if !commit {
				want, wantResult = dedupe.DecisionNew, ""
			}
			if a.err != nil || a.c.Decision != want {
				t.Fatalf("second claim: %v %v, want %v", a.c.Decision, a.err, want)
			}
			if want == dedupe.DecisionDuplicate && string(a.c.Record.Result) != wantResult {
				t.Fatalf("second claim result %q, want %q", a.c.Record.Result, wantResult)
			}
			mustApplied(t, h, req.Key, 1)
		})
	}
}

func testScopes[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	a, b := Req("handler-a", "m-1", "p"), Req("handler-b", "m-1", "p")
	for _, r := range []dedupe.Request{a, b} {
		c, err := Do(ctx, h, r, nil)
		if err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("%s: %v %v, want new", r.Key, c.Decision, err)
		}
	}
	mustApplied(t, h, a.Key, 1)
	mustApplied(t, h, b.Key, 1)
}

func testInvalid[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	long := make([]byte, dedupe.MaxKeyLen+1)
	for i := range long {
		long[i] = 'k'
	}
	cases := map[string]dedupe.Request{
		"empty id":       Req("s", "", "p"),
		"empty scope":    Req("", "m", "p"),
		"long id":        Req("s", string(long), "p"),
		"control char":   Req("s", "m\x00", "p"),
		"bad utf8":       Req("s", "m\xff", "p"),
		"bad fingerprnt": {Key: dedupe.Key{Scope: "s", ID: "m"}, Fingerprint: "abc"},
	}
	for name, req := range cases {
		_, err := Do(ctx, h, req, nil)
		if !errors.Is(err, dedupe.ErrInvalidKey) || !dedupe.IsPermanent(err) {
			t.Errorf("%s: err = %v, want ErrInvalidKey", name, err)
		}
		if _, err := h.Store.Acquire(ctx, req, time.Minute); !errors.Is(err, dedupe.ErrInvalidKey) {
			t.Errorf("%s: Acquire err = %v, want ErrInvalidKey", name, err)
		}
	}
	st, err := h.Store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Completed+st.Processing != 0 {
		t.Fatalf("invalid requests stored keys: %+v", st)
	}
}

func testResultTooLarge[TX any](t *testing.T, h Harness[TX]) {
	ctx := context.Background()
	big := make([]byte, h.MaxResultBytes+1)
	req := Req("s", "m-1", "p")
	_, err := Do(ctx, h, req, big)
	if !errors.Is(err, dedupe.ErrResultTooLarge) || !dedupe.IsPermanent(err) {
		t.Fatalf("err = %v, want ErrResultTooLarge", err)
	}
	if _, err := h.Store.Get(ctx, req.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("a failed transaction left its key: %v", err)
	}
	mustApplied(t, h, req.Key, 0)
	c, err := h.Store.Acquire(ctx, req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Complete(ctx, c, big); !errors.Is(err, dedupe.ErrResultTooLarge) {
		t.Fatalf("Complete err = %v, want ErrResultTooLarge", err)
	}
	// Exactly at the limit is fine.
	if err := h.Store.Complete(ctx, c, big[:h.MaxResultBytes]); err != nil {
		t.Fatalf("Complete at the limit: %v", err)
	}
}

func testCancelled[TX any](t *testing.T, h Harness[TX]) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := Req("s", "m-1", "p")
	if _, err := h.Store.Acquire(ctx, req, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: err = %v, want context.Canceled", err)
	}
	if _, err := Do(ctx, h, req, nil); err == nil {
		t.Fatal("Do with a cancelled context succeeded")
	}
	if _, err := h.Store.Get(context.Background(), req.Key); !errors.Is(err, dedupe.ErrNotFound) {
		t.Fatalf("a cancelled claim left a key: %v", err)
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

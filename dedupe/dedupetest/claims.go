package dedupetest

// The transactional protocol: claim, apply, complete and commit, or roll
// back; duplicates, reused keys, concurrent claims and invalid requests.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

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

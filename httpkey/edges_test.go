package httpkey_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/httpkey"
)

// A 202 Accepted with Retry-After (the usual "accepted, poll later"
// answer) is a success: it must not be answered for a transaction that
// rolled back.
func TestAcceptedWithRetryAfterIsCommitted(t *testing.T) {
	f := newFixture(t, nil)
	f.h = f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if _, err := httpkey.Tx(ctx).Exec(ctx, "INSERT INTO "+f.db.Table("payments")+" (tenant, amount) VALUES ('acme', 5)"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Retry-After", "5")
		w.Header().Set("Location", "/payments/status/1")
		w.WriteHeader(http.StatusAccepted)
	}))
	w := f.do(call{key: `"acc"`, body: `{"amount":5}`})
	if w.Code >= 200 && w.Code < 300 && f.payments() != 1 {
		t.Fatalf("answered %d, but %d payments committed: a success for a request that did not commit", w.Code, f.payments())
	}
}

// In lease mode, a handler whose effect happened and that answers 202 with
// Retry-After must not have its key released: the retry would run the
// effect again.
func TestLeaseAcceptedWithRetryAfterRunsOnce(t *testing.T) {
	f := newFixture(t, &httpkey.Config{Lease: 2 * time.Second})
	var charged atomic.Int64
	f.h = f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charged.Add(1)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusAccepted)
	}))
	for range 2 {
		if w := f.do(call{key: `"lacc"`, body: `{"amount":5}`}); w.Code != http.StatusAccepted {
			t.Fatalf("answered %d %s", w.Code, w.Body)
		}
	}
	if n := charged.Load(); n != 1 {
		t.Fatalf("the effect ran %d times for one key", n)
	}
}

// A client whose clock is a little ahead mints a UUIDv7 key "in the
// future": the request's message IDs must not change once the server's
// clock passes the key's time, or a re-application after a restore emits
// its event under a new ID.
func TestMessageIDStableForKeyFromTheFuture(t *testing.T) {
	f := newFixture(t, nil)
	ahead := time.Now().Add(1500 * time.Millisecond)
	k, err := uuid.NewV7FromReader(strings.NewReader(strings.Repeat("x", 64)))
	if err != nil {
		t.Fatal(err)
	}
	// Put the clock-ahead time in the UUIDv7's 48 time bits.
	ms := ahead.UnixMilli()
	for i := 0; i < 6; i++ {
		k[i] = byte(ms >> (8 * (5 - i)))
	}
	key := `"` + k.String() + `"`
	idOf := func() string {
		var id string
		if err := f.db.Pool.QueryRow(context.Background(), "SELECT uuid::text FROM "+f.db.Table("exactly_outbox")).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	if w := f.do(call{key: key, body: `{"amount":3}`}); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	first := idOf()
	// The database is restored to before the request committed.
	f.db.DeleteKeys(t, "")
	for _, tbl := range []string{f.db.Table("exactly_outbox"), f.db.Table("payments")} {
		if _, err := f.db.Pool.Exec(context.Background(), "DELETE FROM "+tbl); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !time.Now().After(ahead) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // poll the clock
	}
	if w := f.do(call{key: key, body: `{"amount":3}`}); w.Code != http.StatusCreated {
		t.Fatalf("retry: %d %s", w.Code, w.Body)
	}
	if again := idOf(); again != first {
		t.Fatalf("the same request re-applied emitted its event as %s, first as %s", again, first)
	}
}

// A handler that commits through a savepoint's handle (tx.Begin, or
// pgx.BeginFunc) must not leave its writes committed behind an answer
// that says nothing was applied, nor be applied twice on the retry.
func TestCommitThroughSavepoint(t *testing.T) {
	for _, how := range []string{"savepoint", "prepared"} {
		t.Run(how, func(t *testing.T) {
			f := newFixture(t, nil)
			f.hook = func(r *http.Request, run int64) int {
				ctx := r.Context()
				tx := httpkey.Tx(ctx)
				switch how {
				case "savepoint":
					_ = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
						_, err := sp.Exec(ctx, "COMMIT")
						return err
					})
				case "prepared":
					if _, err := tx.Prepare(ctx, "c", "COMMIT"); err == nil {
						t.Error("a prepared COMMIT was not refused")
					}
					_, _ = tx.Exec(ctx, "c")
				}
				return 0
			}
			w := f.do(call{key: `"sp"`, body: `{"amount":4}`})
			if w.Code >= 400 && f.payments() != 0 {
				t.Errorf("answered %d %s, but %d payments committed", w.Code, w.Body, f.payments())
			}
			w = f.do(call{key: `"sp"`, body: `{"amount":4}`})
			t.Logf("retry answered %d %s; payments %d", w.Code, w.Body, f.payments())
			if p := f.payments(); p > 1 {
				t.Fatalf("retry answered %d %s: %d payments for one key", w.Code, w.Body, p)
			}
		})
	}
}

// MessageID across modes and principals: the same key of two principals
// gives different IDs; the same request in Wait and non-Wait mode the
// same IDs.
func TestMessageIDAcrossModesAndPrincipals(t *testing.T) {
	var mu sync.Mutex
	ids := map[bool][]string{}
	t.Run("modes", func(t *testing.T) {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
				f := newFixture(t, &httpkey.Config{Wait: wait})
				var got []string
				for _, tenant := range []string{"acme", "bcme"} {
					if w := f.do(call{key: `"same"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": tenant}}); w.Code != http.StatusCreated {
						t.Fatalf("%d %s", w.Code, w.Body)
					}
				}
				rows, err := f.db.Pool.Query(context.Background(), "SELECT uuid FROM "+f.db.Table("exactly_outbox")+" ORDER BY id")
				if err != nil {
					t.Fatal(err)
				}
				got, err = pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				ids[wait] = got
				mu.Unlock()
			})
		}
	})
	a, b := ids[false], ids[true]
	if len(a) != 2 || len(b) != 2 {
		t.Fatalf("ids %v", ids)
	}
	if a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("the same requests got IDs %v without Wait, %v with Wait", a, b)
	}
	if a[0] == a[1] {
		t.Fatalf("two principals' requests share the message ID %s", a[0])
	}
}

// A request whose handler is blocked (on a lock another transaction
// holds) and whose client went away ends when the server is closed:
// http.Server.Close (httptest's Close) cuts the connection: a request
// blocked on a lock goes on for Config.GoneTimeout at most, then its
// context ends and it rolls back.
func TestServerCloseEndsABlockedRequest(t *testing.T) {
	f := newFixture(t, &httpkey.Config{GoneTimeout: time.Second})
	ctx := context.Background()
	holder, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_xact_lock(7770)"); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	f.hook = func(r *http.Request, run int64) int {
		close(entered)
		if _, err := httpkey.Tx(r.Context()).Exec(r.Context(), "SELECT pg_advisory_xact_lock(7770)"); err != nil {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	srv := httptest.NewServer(f.h)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		req, _ := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set(httpkey.Header, `"blk"`)
		if resp, err := srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	cancel() // the client goes away
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		_ = holder.Rollback(ctx) // let it end, so that the test can
		<-closed
		t.Fatalf("server Close did not end a blocked request whose client went away in 10s: it ran until the lock was released")
	}
	f.state(0, 0, 0)
}

// Concurrent duplicates of a request whose handler answers 409 after a
// failed statement (stored in a transaction of its own): every client
// gets that 409 (or, without Wait, the in-flight 409), the key is stored
// once, nothing of the handler's writes stays, and no duplicate runs the
// handler after the answer is stored.
func TestAbortedAnswerRacingDuplicates(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			f := newFixture(t, &httpkey.Config{Wait: wait})
			ctx := context.Background()
			if _, err := f.db.Pool.Exec(ctx, "CREATE UNIQUE INDEX one_per_tenant ON "+f.db.Table("payments")+" (tenant);"+
				"INSERT INTO "+f.db.Table("payments")+" (tenant, amount) VALUES ('acme', 1)"); err != nil {
				t.Fatal(err)
			}
			f.h = f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f.runs.Add(1)
				_, err := httpkey.Tx(r.Context()).Exec(r.Context(), "INSERT INTO "+f.db.Table("payments")+" (tenant, amount) VALUES ('acme', 2)")
				if err == nil {
					w.WriteHeader(http.StatusCreated)
					return
				}
				w.WriteHeader(http.StatusConflict)
				_, _ = w.Write([]byte(`{"error":"exists"}`))
			}))
			const n = 12
			var wg sync.WaitGroup
			codes := make([]string, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w := f.do(call{key: `"race"`, body: `{}`})
					codes[i] = fmt.Sprintf("%d %s", w.Code, w.Body)
				}()
			}
			wg.Wait()
			for i, c := range codes {
				if c != `409 {"error":"exists"}` && (wait || !strings.Contains(c, "idempotency-key-in-flight")) {
					t.Errorf("request %d answered %s", i, c)
				}
			}
			runs := f.runs.Load()
			if w := f.do(call{key: `"race"`, body: `{}`}); w.Code != http.StatusConflict || w.Body.String() != `{"error":"exists"}` ||
				w.Header().Get(httpkey.ReplayedHeader) != "true" {
				t.Fatalf("replay: %d %s", w.Code, w.Body)
			}
			if f.runs.Load() != runs {
				t.Fatal("the handler ran again after its answer was stored")
			}
			f.state(1, 1, 0)
		})
	}
}

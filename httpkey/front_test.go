package httpkey_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/httpkey"
)

// A client that sends its request and half-closes its side (some clients
// and proxies do) still gets the request applied and answered: before, the
// request's context ended with the read side, the transaction rolled back
// and net/http answered 200 with an empty body.
func TestHalfClosedClientGetsItsAnswer(t *testing.T) {
	f := newFixture(t, nil)
	f.hook = func(r *http.Request, run int64) int {
		// Give the server's read of the closed side time to end the
		// request's context (it did at once, before).
		select {
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
		}
		return 0
	}
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	send := func() (int, string, http.Header) {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := `{"amount":7}`
		fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nX-Tenant: acme\r\nIdempotency-Key: \"hc\"\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	code, body, _ := send()
	if code != http.StatusCreated {
		t.Fatalf("half-closed request answered %d %q", code, body)
	}
	f.state(1, 1, 1)
	code, again, h := send()
	if code != http.StatusCreated || again != body || h.Get(httpkey.ReplayedHeader) != "true" {
		t.Fatalf("retry answered %d %q %v, want the stored 201 %q", code, again, h, body)
	}
	f.state(1, 1, 1)
}

// A principal the key store cannot hold is the client's error (401), not
// an outage to retry for ever.
func TestPrincipalTheStoreCannotHold(t *testing.T) {
	f := newFixture(t, nil)
	for _, p := range []string{"ac\tme", "ac\xffme"} {
		w := f.do(call{key: `"p"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": p}})
		problemOf(t, w, http.StatusUnauthorized, httpkey.ReasonPrincipalInvalid)
		if w.Header().Get("Retry-After") != "" {
			t.Fatalf("principal %q: Retry-After %q", p, w.Header().Get("Retry-After"))
		}
	}
	f.state(0, 0, 0)
}

// A COMMIT the database refuses for good (a deferred constraint) is a
// final 500, not a 503 to retry.
func TestCommitRefusedForGood(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			f := newFixture(t, &httpkey.Config{Wait: wait})
			ctx := context.Background()
			if _, err := f.db.Pool.Exec(ctx, "ALTER TABLE "+f.db.Table("payments")+
				" ADD CONSTRAINT small CHECK (amount < 100) NOT VALID; CREATE TABLE "+f.db.Table("refs")+
				" (id bigint REFERENCES "+f.db.Table("payments")+" (id) DEFERRABLE INITIALLY DEFERRED)"); err != nil {
				t.Fatal(err)
			}
			f.hook = func(r *http.Request, _ int64) int {
				if _, err := httpkey.Tx(r.Context()).Exec(r.Context(), "INSERT INTO "+f.db.Table("refs")+" VALUES (-1)"); err != nil {
					t.Error(err)
				}
				return 0
			}
			for range 2 {
				w := f.do(call{key: `"d"`, body: `{"amount":1}`})
				problemOf(t, w, http.StatusInternalServerError, httpkey.ReasonRefused)
				if w.Header().Get("Retry-After") != "" {
					t.Fatalf("Retry-After %q on a final refusal", w.Header().Get("Retry-After"))
				}
			}
			f.state(0, 0, 0)
		})
	}
}

// A handler that maps a failed statement (a unique violation) to its own
// 4xx gets that answer stored and replayed, without its writes: before, the
// aborted transaction could not store it, and the client was told to retry
// for ever.
func TestHandlerAnswerAfterFailedStatementIsKept(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			f := newFixture(t, &httpkey.Config{Wait: wait})
			ctx := context.Background()
			if _, err := f.db.Pool.Exec(ctx, "CREATE UNIQUE INDEX one_per_tenant ON "+f.db.Table("payments")+" (tenant)"); err != nil {
				t.Fatal(err)
			}
			conflict := func(w http.ResponseWriter, r *http.Request) {
				f.runs.Add(1)
				tx := httpkey.Tx(r.Context())
				_, err := tx.Exec(r.Context(), "INSERT INTO "+f.db.Table("payments")+" (tenant, amount) VALUES ('acme', 1)")
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "23505" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusConflict)
					_, _ = io.WriteString(w, `{"error":"one payment per tenant"}`)
					return
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				_ = httpkey.WriteOutbox(r.Context(), "payments", message.NewMessage("", []byte("x")))
				w.WriteHeader(http.StatusCreated)
			}
			f.h = f.mw.Wrap(http.HandlerFunc(conflict))
			if w := f.do(call{key: `"first"`, body: `{}`}); w.Code != http.StatusCreated {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			for i := range 3 {
				w := f.do(call{key: `"second"`, body: `{}`})
				if w.Code != http.StatusConflict || w.Body.String() != `{"error":"one payment per tenant"}` {
					t.Fatalf("attempt %d: %d %s, want the handler's 409", i, w.Code, w.Body)
				}
				if replayed := w.Header().Get(httpkey.ReplayedHeader) == "true"; replayed != (i > 0) {
					t.Fatalf("attempt %d: replayed %v", i, replayed)
				}
			}
			if n := f.runs.Load(); n != 2 {
				t.Fatalf("the handler ran %d times, want 2 (once per key)", n)
			}
			f.state(1, 2, 1)
		})
	}
}

// "Not now" answers (429, or any with Retry-After) are not stored: the
// retry runs the handler again, as for a 5xx.
func TestNotNowAnswersAreNotKept(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusLocked, http.StatusTooEarly, http.StatusConflict} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			f := newFixture(t, nil)
			runs := 0
			f.h = f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				if runs == 1 {
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(status)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			w := f.do(call{key: `"n"`, body: `{}`})
			if w.Code != status || w.Header().Get("Retry-After") != "1" {
				t.Fatalf("first: %d %v", w.Code, w.Header())
			}
			if w := f.do(call{key: `"n"`, body: `{}`}); w.Code != http.StatusCreated || runs != 2 {
				t.Fatalf("retry: %d after %d runs; want 201 from a second run", w.Code, runs)
			}
		})
	}
}

// A handler that commits or rolls back the request's transaction is
// refused, answered 500 handler-ended-transaction, and nothing is left:
// before, the key was left with no stored response (503, then 500 on every
// retry).
func TestHandlerEndingTheRequestTransaction(t *testing.T) {
	for _, wait := range []bool{false, true} {
		for _, habit := range []string{"commit", "rollback", "sql-commit", "swallowed"} {
			t.Run(fmt.Sprintf("wait=%v/%s", wait, habit), func(t *testing.T) {
				f := newFixture(t, &httpkey.Config{Wait: wait})
				f.hook = func(r *http.Request, _ int64) int {
					ctx, tx := r.Context(), httpkey.Tx(r.Context())
					switch habit {
					case "commit":
						_ = tx.Commit(ctx)
					case "rollback":
						_ = tx.Rollback(ctx)
					case "sql-commit":
						_, _ = tx.Exec(ctx, "COMMIT")
					case "swallowed":
						_, _ = tx.Exec(ctx, "SELECT 1/0")
					}
					return 0
				}
				for range 2 {
					problemOf(t, f.do(call{key: `"h"`, body: `{"amount":3}`}), http.StatusInternalServerError, httpkey.ReasonHandlerTx)
				}
				f.state(0, 0, 0)
			})
		}
	}
}

// The messages a request writes get the same IDs when the request is
// applied again: the database restored to before the request committed,
// and the client's retry with its key.
func TestOutputIDsSurviveARestore(t *testing.T) {
	for _, key := range []string{`"plain-key"`, `"0190a0e8-1234-7abc-8def-0123456789ab"`} {
		t.Run(key, func(t *testing.T) {
			f := newFixture(t, nil)
			ids := func() []string {
				rows, err := f.db.Pool.Query(context.Background(), "SELECT uuid FROM "+f.db.Table("exactly_outbox")+" ORDER BY id")
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for rows.Next() {
					var id string
					if err := rows.Scan(&id); err != nil {
						t.Fatal(err)
					}
					out = append(out, id)
				}
				return out
			}
			if w := f.do(call{key: key, body: `{"amount":9}`}); w.Code != http.StatusCreated {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			first := ids()
			// The restore: the request's commit is gone.
			if _, err := f.db.Pool.Exec(context.Background(), "DELETE FROM "+f.db.Table("exactly_outbox")+"; DELETE FROM "+
				f.db.Table("payments")); err != nil {
				t.Fatal(err)
			}
			f.db.DeleteKeys(t, "")
			if w := f.do(call{key: key, body: `{"amount":9}`}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
				t.Fatalf("after the restore: %d %v", w.Code, w.Header())
			}
			again := ids()
			if len(first) != 1 || len(again) != 1 || first[0] != again[0] {
				t.Fatalf("the output's ID was %v, and %v when applied again", first, again)
			}
			if strings.Contains(key, "0190a0e8") && !strings.HasPrefix(first[0], "0190a0e8-1234-7") {
				t.Errorf("the output's ID %s does not carry the UUIDv7 key's time", first[0])
			}
		})
	}
}

// Lease mode: a handler whose 2xx body is over MaxResponseBytes has run
// its effect, so the key is completed (not released) and the retry does
// not run it again.
func TestLeaseResponseTooLargeIsNotRunAgain(t *testing.T) {
	f := newFixture(t, &httpkey.Config{Lease: 10 * time.Second, MaxResponseBytes: 16})
	for i := range 2 {
		w := f.do(call{key: `"big"`, body: `{"amount":1}`})
		if w.Code != http.StatusCreated {
			t.Fatalf("attempt %d: %d %s", i, w.Code, w.Body)
		}
		var p httpkey.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Reason != httpkey.ReasonResponseLarge {
			t.Fatalf("attempt %d: body %s", i, w.Body)
		}
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

// Lease mode: a handler slower than its lease keeps its key (the lease is
// extended while it runs), so a duplicate after the lease's first length
// gets 409 instead of running the handler a second time.
func TestLeaseOutlivedByItsHandlerIsNotTakenOver(t *testing.T) {
	f := newFixture(t, &httpkey.Config{Lease: time.Second})
	release := make(chan struct{})
	f.hook = func(r *http.Request, run int64) int {
		if run == 1 {
			<-release
		}
		return 0
	}
	var wg sync.WaitGroup
	var first *httptest.ResponseRecorder
	wg.Add(1)
	go func() {
		defer wg.Done()
		first = f.do(call{key: `"slow"`, body: `{"amount":1}`})
	}()
	time.Sleep(2500 * time.Millisecond) // two and a half lease lengths
	dup := f.do(call{key: `"slow"`, body: `{"amount":1}`})
	close(release)
	wg.Wait()
	if dup.Code != http.StatusConflict {
		t.Fatalf("a duplicate after the lease's length: %d %s, want 409", dup.Code, dup.Body)
	}
	if first.Code != http.StatusCreated {
		t.Fatalf("the first request: %d %s", first.Code, first.Body)
	}
	if n := f.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

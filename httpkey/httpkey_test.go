package httpkey_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// fixture is one schema with the key table, the outbox and a payments
// table, and a middleware in front of a handler that records a payment,
// writes an event to the outbox and answers 201 with the payment's id.
type fixture struct {
	t      *testing.T
	db     *pgtest.DB
	store  *pgstore.Store
	mw     *httpkey.Middleware
	h      http.Handler
	runs   atomic.Int64
	layout pgstore.Layout
	// hook, when set, runs in the handler after its writes; a status it
	// returns other than 0 is the handler's answer.
	hook func(r *http.Request, run int64) int
}

func newFixture(t *testing.T, cfg *httpkey.Config) *fixture {
	t.Helper()
	return newFixtureLayout(t, cfg, pgstore.LayoutPartitioned)
}

func newFixtureLayout(t *testing.T, cfg *httpkey.Config, layout pgstore.Layout) *fixture {
	t.Helper()
	t.Parallel()
	f := &fixture{t: t, db: pgtest.New(t), layout: layout}
	ctx := context.Background()
	if _, err := f.db.Pool.Exec(ctx, "CREATE TABLE "+f.db.Table("payments")+
		" (id bigserial PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.store, err = pgstore.New(f.db.Pool, &pgstore.Config{Schema: f.db.Schema, Layout: layout, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(&outbox.Config{Schema: f.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &httpkey.Config{}
	}
	if cfg.PrincipalFunc == nil && !cfg.Unauthenticated {
		cfg.PrincipalFunc = func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }
	}
	cfg.Outbox = w
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := f.store.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if f.mw, err = httpkey.New(f.store, cfg); err != nil {
		t.Fatal(err)
	}
	f.h = f.mw.Wrap(http.HandlerFunc(f.pay))
	return f
}

type payment struct {
	Amount int64 `json:"amount"`
}

func (f *fixture) pay(w http.ResponseWriter, r *http.Request) {
	run := f.runs.Add(1)
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 {
		http.Error(w, "bad payment", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tenant := r.Header.Get("X-Tenant")
	var id int64
	if tx := httpkey.Tx(ctx); tx != nil {
		if err := tx.QueryRow(ctx, "INSERT INTO "+f.db.Table("payments")+" (tenant, amount) VALUES ($1, $2) RETURNING id",
			tenant, p.Amount).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := httpkey.WriteOutbox(ctx, "payments", message.NewMessage("", []byte(strconv.FormatInt(id, 10)))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if f.hook != nil {
		if status := f.hook(r, run); status != 0 {
			http.Error(w, "hook", status)
			return
		}
	}
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.Header().Set("X-Run", strconv.FormatInt(run, 10))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"tenant":%q,"amount":%d}`, id, tenant, p.Amount)
}

type call struct {
	method, path, body, key string
	header                  map[string]string
	ctx                     context.Context
}

func (f *fixture) do(c call) *httptest.ResponseRecorder {
	f.t.Helper()
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/payments"
	}
	if c.ctx == nil {
		c.ctx = context.Background()
	}
	r := httptest.NewRequestWithContext(c.ctx, c.method, c.path, strings.NewReader(c.body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Tenant", "acme")
	if c.key != "" {
		r.Header.Set(httpkey.Header, c.key)
	}
	for k, v := range c.header {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) payments() int {
	return f.count("SELECT count(*) FROM " + f.db.Table("payments"))
}

func (f *fixture) keys() int {
	return f.count("SELECT count(*) FROM " + f.db.Keys())
}

func (f *fixture) outboxRows() int {
	return f.count("SELECT count(*) FROM " + f.db.Table("exactly_outbox"))
}

// state asserts the rows: payments, keys, outbox messages.
func (f *fixture) state(payments, keys, outboxRows int) {
	f.t.Helper()
	if p, k, o := f.payments(), f.keys(), f.outboxRows(); p != payments || k != keys || o != outboxRows {
		f.t.Fatalf("payments, keys, outbox rows = %d, %d, %d; want %d, %d, %d", p, k, o, payments, keys, outboxRows)
	}
}

func problemOf(t *testing.T, w *httptest.ResponseRecorder, status int, reason string) httpkey.Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p httpkey.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %s: %v", w.Body, err)
	}
	if p.Status != status || p.Reason != reason || p.Type != "about:blank" || p.Title == "" {
		t.Fatalf("problem %+v, want status %d reason %s", p, status, reason)
	}
	return p
}

func TestFirstRunThenReplay(t *testing.T) {
	f := newFixture(t, nil)
	first := f.do(call{key: `"k1"`, body: `{"amount":5}`})
	if first.Code != http.StatusCreated || first.Header().Get(httpkey.ReplayedHeader) != "" || first.Header().Get("X-Run") != "1" {
		t.Fatalf("first: %d %v %s", first.Code, first.Header(), first.Body)
	}
	f.state(1, 1, 1)
	for i := 0; i < 3; i++ {
		again := f.do(call{key: `"k1"`, body: `{"amount":5}`})
		if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() {
			t.Fatalf("replay: %d %s, want %d %s", again.Code, again.Body, first.Code, first.Body)
		}
		h := again.Header()
		if h.Get(httpkey.ReplayedHeader) != "true" || h.Get("Location") != first.Header().Get("Location") ||
			h.Get("Content-Type") != "application/json" {
			t.Fatalf("replayed headers %v", h)
		}
		if h.Get("X-Run") != "" {
			t.Fatalf("a header off the allow-list was replayed: X-Run %q", h.Get("X-Run"))
		}
	}
	if f.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", f.runs.Load())
	}
	f.state(1, 1, 1)
	var status, scope string
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT status, scope FROM "+f.db.Keys()+" WHERE key = '4:acme/k1'").
		Scan(&status, &scope); err != nil {
		t.Fatal(err)
	}
	if status != "COMPLETED" || scope != "http" {
		t.Fatalf("key row: status %s scope %s", status, scope)
	}
}

func TestKeyHeader(t *testing.T) {
	f := newFixture(t, nil)
	for _, c := range []struct {
		name   string
		header []string
		reason string
	}{
		{"missing", nil, httpkey.ReasonKeyMissing},
		{"bare token", []string{`abc`}, httpkey.ReasonKeyMalformed},
		{"empty", []string{` `}, httpkey.ReasonKeyMalformed},
		{"empty string", []string{`""`}, httpkey.ReasonKeyMalformed},
		{"two fields", []string{`"a"`, `"b"`}, httpkey.ReasonKeyMalformed},
		{"unclosed", []string{`"abc`}, httpkey.ReasonKeyMalformed},
		{"bad escape", []string{`"a\nb"`}, httpkey.ReasonKeyMalformed},
		{"non-ascii", []string{"\"a\u00e9\""}, httpkey.ReasonKeyMalformed},
		{"trailing", []string{`"a" "b"`}, httpkey.ReasonKeyMalformed},
		{"too long", []string{`"` + strings.Repeat("x", 256) + `"`}, httpkey.ReasonKeyMalformed},
		{"too long with the principal", []string{`"` + strings.Repeat("x", 255-6) + `"`}, httpkey.ReasonKeyMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
			r.Header.Set("X-Tenant", "acme")
			for _, v := range c.header {
				r.Header.Add(httpkey.Header, v)
			}
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, r)
			problemOf(t, w, http.StatusBadRequest, c.reason)
		})
	}
	f.state(0, 0, 0)
	// The longest key, and escapes, are keys.
	for _, k := range []string{`"` + strings.Repeat("x", 255-7) + `"`, `"a\"b\\c"`, ` "spaced" `} {
		if w := f.do(call{key: k, body: `{"amount":1}`}); w.Code != http.StatusCreated {
			t.Fatalf("key %s: %d %s", k, w.Code, w.Body)
		}
	}
	f.state(3, 3, 3)
	if n := f.count("SELECT count(*) FROM " + f.db.Keys() + ` WHERE key IN ('4:acme/a"b\c', '4:acme/spaced')`); n != 2 {
		t.Fatalf("unescaped keys stored: %d, want 2", n)
	}
}

func TestBareKeys(t *testing.T) {
	f := newFixture(t, &httpkey.Config{AllowBareKeys: true})
	if w := f.do(call{key: `KG5LxwFBepaKHyUD`, body: `{"amount":1}`}); w.Code != http.StatusCreated {
		t.Fatalf("bare key: %d %s", w.Code, w.Body)
	}
	// The bare and the quoted form are the same key.
	if w := f.do(call{key: `"KG5LxwFBepaKHyUD"`, body: `{"amount":1}`}); w.Header().Get(httpkey.ReplayedHeader) != "true" {
		t.Fatalf("quoted form of a bare key: %d %v", w.Code, w.Header())
	}
	problemOf(t, f.do(call{key: `a b`, body: `{"amount":1}`}), http.StatusBadRequest, httpkey.ReasonKeyMalformed)
	f.state(1, 1, 1)
}

func TestFingerprint(t *testing.T) {
	f := newFixture(t, &httpkey.Config{FingerprintHeaders: []string{"Api-Version"}})
	v1 := map[string]string{"Api-Version": "2024-01-01"}
	if w := f.do(call{key: `"k"`, body: `{"amount":7, "note":"x"}`, header: v1}); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	// The same JSON, written otherwise: a duplicate.
	if w := f.do(call{key: `"k"`, body: `{ "note" : "x", "amount" : 7.0 }`, header: v1}); w.Header().Get(httpkey.ReplayedHeader) != "true" {
		t.Fatalf("reordered JSON: %d %v %s", w.Code, w.Header(), w.Body)
	}
	for name, c := range map[string]call{
		"body":      {key: `"k"`, body: `{"amount":8, "note":"x"}`, header: v1},
		"route":     {key: `"k"`, body: `{"amount":7, "note":"x"}`, header: v1, path: "/payments?dry=1"},
		"method":    {key: `"k"`, body: `{"amount":7, "note":"x"}`, header: v1, method: http.MethodPut},
		"header":    {key: `"k"`, body: `{"amount":7, "note":"x"}`, header: map[string]string{"Api-Version": "2025-01-01"}},
		"no header": {key: `"k"`, body: `{"amount":7, "note":"x"}`},
		"not JSON":  {key: `"k"`, body: `{"amount":7, "note":"x"}`, header: map[string]string{"Api-Version": "2024-01-01", "Content-Type": "text/plain"}},
	} {
		problemOf(t, f.do(c), http.StatusUnprocessableEntity, httpkey.ReasonKeyReused)
		_ = name
	}
	if f.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", f.runs.Load())
	}
	f.state(1, 1, 1)
}

func TestConcurrentDuplicatesConflict(t *testing.T) {
	const n = 12
	f := newFixture(t, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	f.hook = func(*http.Request, int64) int {
		close(entered)
		<-release
		return 0
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- f.do(call{key: `"dup"`, body: `{"amount":3}`}) }()
	<-entered
	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, n)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = f.do(call{key: `"dup"`, body: `{"amount":3}`})
		}()
	}
	wg.Wait()
	for _, w := range answers {
		problemOf(t, w, http.StatusConflict, httpkey.ReasonInFlight)
		if w.Header().Get("Retry-After") != "1" {
			t.Fatalf("Retry-After %q, want 1", w.Header().Get("Retry-After"))
		}
	}
	close(release)
	w := <-first
	if w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	// Later duplicates, at once, all get the first answer.
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = f.do(call{key: `"dup"`, body: `{"amount":3}`})
		}()
	}
	wg.Wait()
	for _, a := range answers {
		if a.Code != http.StatusCreated || a.Body.String() != w.Body.String() || a.Header().Get(httpkey.ReplayedHeader) != "true" {
			t.Fatalf("duplicate after the first: %d %s, want the replay of %s", a.Code, a.Body, w.Body)
		}
	}
	if f.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", f.runs.Load())
	}
	f.state(1, 1, 1)
}

// TestConcurrentDuplicatesRace sends duplicates at once with no ordering:
// exactly one runs, every other gets 409 or the first answer.
func TestConcurrentDuplicatesRace(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			const n = 16
			f := newFixture(t, &httpkey.Config{Wait: wait})
			var wg sync.WaitGroup
			answers := make([]*httptest.ResponseRecorder, n)
			start := make(chan struct{})
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					answers[i] = f.do(call{key: `"race"`, body: `{"amount":3}`})
				}()
			}
			close(start)
			wg.Wait()
			var created, conflicts int
			var body string
			for _, w := range answers {
				switch w.Code {
				case http.StatusCreated:
					if body != "" && w.Body.String() != body {
						t.Fatalf("two answers for one key: %s and %s", body, w.Body)
					}
					body = w.Body.String()
					created++
				case http.StatusConflict:
					if wait {
						t.Fatalf("409 with Config.Wait: %s", w.Body)
					}
					conflicts++
				default:
					t.Fatalf("answer %d %s", w.Code, w.Body)
				}
			}
			if created == 0 || created+conflicts != n {
				t.Fatalf("created %d, conflicts %d of %d", created, conflicts, n)
			}
			if f.runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", f.runs.Load())
			}
			f.state(1, 1, 1)
		})
	}
}

// TestWaitGetsTheFirstAnswer: with Config.Wait, duplicates that arrive
// while the first request runs wait for it and get its answer.
func TestWaitGetsTheFirstAnswer(t *testing.T) {
	const n = 6
	f := newFixture(t, &httpkey.Config{Wait: true})
	entered, release := make(chan struct{}), make(chan struct{})
	f.hook = func(*http.Request, int64) int {
		close(entered)
		<-release
		return 0
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- f.do(call{key: `"w"`, body: `{"amount":3}`}) }()
	<-entered
	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, n)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = f.do(call{key: `"w"`, body: `{"amount":3}`})
		}()
	}
	// The duplicates are waiting on the first's key row.
	deadline := time.Now().Add(20 * time.Second)
	for f.count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'", f.db.Schema) < n {
		if time.Now().After(deadline) {
			t.Fatal("duplicates are not waiting for the key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	w := <-first
	for _, a := range answers {
		if a.Code != http.StatusCreated || a.Body.String() != w.Body.String() || a.Header().Get(httpkey.ReplayedHeader) != "true" {
			t.Fatalf("waiting duplicate: %d %s, want the replay of %s", a.Code, a.Body, w.Body)
		}
	}
	if f.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", f.runs.Load())
	}
	f.state(1, 1, 1)
}

func TestTenantsIsolated(t *testing.T) {
	f := newFixture(t, nil)
	a := f.do(call{key: `"same"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": "a"}})
	b := f.do(call{key: `"same"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": "b"}})
	if a.Code != http.StatusCreated || b.Code != http.StatusCreated || a.Header().Get(httpkey.ReplayedHeader) != "" ||
		b.Header().Get(httpkey.ReplayedHeader) != "" {
		t.Fatalf("a: %d %v; b: %d %v", a.Code, a.Header(), b.Code, b.Header())
	}
	for tenant, first := range map[string]*httptest.ResponseRecorder{"a": a, "b": b} {
		again := f.do(call{key: `"same"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": tenant}})
		if again.Body.String() != first.Body.String() || !strings.Contains(again.Body.String(), `"tenant":"`+tenant+`"`) {
			t.Fatalf("tenant %s got %s, want %s", tenant, again.Body, first.Body)
		}
	}
	f.state(2, 2, 2)
	// No principal: refused, nothing claimed.
	problemOf(t, f.do(call{key: `"same"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": ""}}), http.StatusUnauthorized, httpkey.ReasonNoPrincipal)
	f.state(2, 2, 2)
	if _, err := httpkey.New(f.store, &httpkey.Config{}); err == nil || !strings.Contains(err.Error(), "PrincipalFunc") {
		t.Fatalf("New without PrincipalFunc: %v", err)
	}
	if _, err := httpkey.New(f.store, &httpkey.Config{Unauthenticated: true}); err != nil {
		t.Fatalf("New with Unauthenticated: %v", err)
	}
}

func TestServerErrorRollsBack(t *testing.T) {
	f := newFixture(t, nil)
	f.hook = func(_ *http.Request, run int64) int {
		if run == 1 {
			return http.StatusInternalServerError
		}
		return 0
	}
	if w := f.do(call{key: `"k"`, body: `{"amount":2}`}); w.Code != http.StatusInternalServerError || w.Header().Get(httpkey.ReplayedHeader) != "" {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	f.state(0, 0, 0)
	retry := f.do(call{key: `"k"`, body: `{"amount":2}`})
	if retry.Code != http.StatusCreated || retry.Header().Get(httpkey.ReplayedHeader) != "" {
		t.Fatalf("retry: %d %v", retry.Code, retry.Header())
	}
	if w := f.do(call{key: `"k"`, body: `{"amount":2}`}); w.Body.String() != retry.Body.String() || w.Header().Get(httpkey.ReplayedHeader) != "true" {
		t.Fatalf("after the retry: %d %s", w.Code, w.Body)
	}
	if f.runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", f.runs.Load())
	}
	f.state(1, 1, 1)
}

func TestClientErrorKept(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("kept=%v", keep), func(t *testing.T) {
			cfg := &httpkey.Config{}
			if !keep {
				cfg.KeepFunc = func(status int) bool { return status < 400 }
			}
			f := newFixture(t, cfg)
			first := f.do(call{key: `"bad"`, body: `{"amount":-1}`})
			if first.Code != http.StatusBadRequest {
				t.Fatalf("first: %d %s", first.Code, first.Body)
			}
			again := f.do(call{key: `"bad"`, body: `{"amount":-1}`})
			if again.Code != http.StatusBadRequest || again.Body.String() != first.Body.String() {
				t.Fatalf("again: %d %s", again.Code, again.Body)
			}
			wantRuns, wantKeys, replayed := 1, 1, "true"
			if !keep {
				wantRuns, wantKeys, replayed = 2, 0, ""
			}
			if got := again.Header().Get(httpkey.ReplayedHeader); got != replayed {
				t.Fatalf("Idempotent-Replayed %q, want %q", got, replayed)
			}
			if f.runs.Load() != int64(wantRuns) {
				t.Fatalf("handler ran %d times, want %d", f.runs.Load(), wantRuns)
			}
			f.state(0, wantKeys, 0)
		})
	}
}

// chunked hides a body's length, as a chunked request does.
type chunked struct{ io.Reader }

func TestBodyTooLarge(t *testing.T) {
	f := newFixture(t, &httpkey.Config{MaxBodyBytes: 64})
	big := `{"amount":1,"pad":"` + strings.Repeat("x", 64) + `"}`
	problemOf(t, f.do(call{key: `"big"`, body: big}), http.StatusRequestEntityTooLarge, httpkey.ReasonBodyTooLarge)
	r := httptest.NewRequest(http.MethodPost, "/payments", chunked{strings.NewReader(big)})
	r.Header.Set("X-Tenant", "acme")
	r.Header.Set(httpkey.Header, `"big"`)
	if r.ContentLength != -1 {
		t.Fatalf("ContentLength %d, want -1", r.ContentLength)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	problemOf(t, w, http.StatusRequestEntityTooLarge, httpkey.ReasonBodyTooLarge)
	if f.runs.Load() != 0 {
		t.Fatalf("handler ran %d times", f.runs.Load())
	}
	f.state(0, 0, 0)
	// At the limit it runs.
	if w := f.do(call{key: `"big"`, body: big[:55] + `"}`}); w.Code != http.StatusCreated {
		t.Fatalf("at the limit: %d %s", w.Code, w.Body)
	}
	f.state(1, 1, 1)
}

func TestResponseTooLarge(t *testing.T) {
	f := newFixture(t, &httpkey.Config{MaxResponseBytes: 16})
	problemOf(t, f.do(call{key: `"r"`, body: `{"amount":1}`}), http.StatusInternalServerError, httpkey.ReasonResponseLarge)
	f.state(0, 0, 0)
}

// TestCrashBeforeCommit: the request dies after the handler's writes and
// before the commit; nothing of it stays, and its retry runs once.
func TestCrashBeforeCommit(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		// A client that goes away does not cut its request: what it
		// started commits whole, and its retry gets the stored answer.
		f := newFixture(t, nil)
		ctx, cancel := context.WithCancel(context.Background())
		f.hook = func(_ *http.Request, run int64) int {
			if run == 1 {
				cancel()
			}
			return 0
		}
		if w := f.do(call{key: `"c"`, body: `{"amount":4}`, ctx: ctx}); w.Code != http.StatusCreated {
			t.Fatalf("a request whose client went away answered %d %s", w.Code, w.Body)
		}
		f.state(1, 1, 1)
		if w := f.do(call{key: `"c"`, body: `{"amount":4}`}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "true" {
			t.Fatalf("retry: %d %v", w.Code, w.Header())
		}
		f.state(1, 1, 1)
	})
	t.Run("deadline", func(t *testing.T) {
		// A deadline (an outer middleware's timeout) that passes before
		// the commit: nothing applied, and the answer says so.
		f := newFixture(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		f.hook = func(r *http.Request, run int64) int {
			if run == 1 {
				<-r.Context().Done()
			}
			return 0
		}
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancelShort()
		w := f.do(call{key: `"c"`, body: `{"amount":4}`, ctx: short})
		problemOf(t, w, http.StatusServiceUnavailable, httpkey.ReasonUnavailable)
		if w.Header().Get("Retry-After") == "" {
			t.Fatalf("no Retry-After: %v", w.Header())
		}
		f.state(0, 0, 0)
		if w := f.do(call{key: `"c"`, body: `{"amount":4}`}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
			t.Fatalf("retry: %d %v", w.Code, w.Header())
		}
		f.state(1, 1, 1)
	})
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill/wait=%v", wait), func(t *testing.T) {
			f := newFixture(t, &httpkey.Config{Wait: wait})
			f.hook = func(r *http.Request, run int64) int {
				if run != 1 {
					return 0
				}
				ctx := r.Context()
				var pid int
				if err := httpkey.Tx(ctx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Error(err)
				}
				if _, err := f.db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
					t.Error(err)
				}
				return 0
			}
			w := f.do(call{key: `"c"`, body: `{"amount":4}`})
			if wait {
				// Do runs the transaction again on a lost connection.
				if w.Code != http.StatusCreated {
					t.Fatalf("with Wait: %d %s", w.Code, w.Body)
				}
				if f.runs.Load() != 2 {
					t.Fatalf("handler ran %d times, want 2", f.runs.Load())
				}
			} else {
				problemOf(t, w, http.StatusServiceUnavailable, httpkey.ReasonUnavailable)
				f.state(0, 0, 0)
				// Until the killed backend has ended, its lock answers 409.
				w := retryConflicts(t, f, call{key: `"c"`, body: `{"amount":4}`})
				if w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
					t.Fatalf("retry: %d %v", w.Code, w.Header())
				}
			}
			f.state(1, 1, 1)
		})
	}
}

// retryConflicts sends c again while it gets 409, as a client does.
func retryConflicts(t *testing.T, f *fixture, c call) *httptest.ResponseRecorder {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w := f.do(c)
		if w.Code != http.StatusConflict || time.Now().After(deadline) {
			return w
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOptional(t *testing.T) {
	f := newFixture(t, &httpkey.Config{Optional: true})
	if w := f.do(call{body: `{"amount":1}`}); w.Code != http.StatusCreated {
		t.Fatalf("no key: %d %s", w.Code, w.Body)
	}
	if w := f.do(call{body: `{"amount":1}`}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
		t.Fatalf("no key again: %d %v", w.Code, w.Header())
	}
	f.state(2, 0, 2)
}

func TestLease(t *testing.T) {
	f := newFixture(t, &httpkey.Config{Lease: 500 * time.Millisecond})
	var charged atomic.Int64 // the side effect outside the database
	entered, release := make(chan struct{}), make(chan struct{})
	f.hook = func(r *http.Request, run int64) int {
		if httpkey.Tx(r.Context()) != nil {
			t.Error("a transaction in lease mode")
		}
		if k, ok := httpkey.Key(r.Context()); !ok || (k != "l" && k != "l2") {
			t.Errorf("Key = %q, %v", k, ok)
		}
		switch run {
		case 1:
			close(entered)
			<-release
		case 2:
			panic("process dies after the charge")
		}
		charged.Add(1)
		return 0
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- f.do(call{key: `"l"`, body: `{"amount":9}`}) }()
	<-entered
	w := f.do(call{key: `"l"`, body: `{"amount":9}`})
	problemOf(t, w, http.StatusConflict, httpkey.ReasonInFlight)
	if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); ra != 1 {
		t.Fatalf("Retry-After %q, want 1 (the lease's end)", w.Header().Get("Retry-After"))
	}
	close(release)
	w = <-first
	if w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if again := f.do(call{key: `"l"`, body: `{"amount":9}`}); again.Body.String() != w.Body.String() || again.Header().Get(httpkey.ReplayedHeader) != "true" {
		t.Fatalf("replay: %d %s", again.Code, again.Body)
	}

	// A run that dies holds its key until the lease ends; then a retry
	// takes it over.
	func() {
		defer func() { _ = recover() }()
		f.do(call{key: `"l2"`, body: `{"amount":9}`})
	}()
	problemOf(t, f.do(call{key: `"l2"`, body: `{"amount":9}`}), http.StatusConflict, httpkey.ReasonInFlight)
	if w := retryConflicts(t, f, call{key: `"l2"`, body: `{"amount":9}`}); w.Code != http.StatusCreated {
		t.Fatalf("after the lease: %d %s", w.Code, w.Body)
	}
	var attempts int
	var status string
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT attempts, status FROM "+f.db.Keys()+" WHERE key = '4:acme/l2'").
		Scan(&attempts, &status); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || status != "COMPLETED" || charged.Load() != 2 || f.runs.Load() != 3 {
		t.Fatalf("attempts %d status %s charged %d runs %d; want 2 COMPLETED 2 3", attempts, status, charged.Load(), f.runs.Load())
	}
	f.state(0, 2, 0)
}

// TestLayouts runs the protocol on both key layouts: first run, replay,
// reuse, tenants, a 5xx then its retry, concurrent duplicates.
func TestLayouts(t *testing.T) {
	for _, c := range []struct {
		layout pgstore.Layout
		wait   bool
	}{{pgstore.LayoutSingleTable, false}, {pgstore.LayoutPartitioned, false}, {pgstore.LayoutSingleTable, true}, {pgstore.LayoutPartitioned, true}} {
		t.Run(fmt.Sprintf("%v/wait=%v", c.layout, c.wait), func(t *testing.T) {
			f := newFixtureLayout(t, &httpkey.Config{Wait: c.wait}, c.layout)
			f.hook = func(r *http.Request, run int64) int {
				if r.Header.Get("X-Fail") != "" {
					return http.StatusServiceUnavailable
				}
				return 0
			}
			first := f.do(call{key: `"k"`, body: `{"amount":1}`})
			if first.Code != http.StatusCreated {
				t.Fatalf("first: %d %s", first.Code, first.Body)
			}
			if w := f.do(call{key: `"k"`, body: `{"amount":1}`}); w.Body.String() != first.Body.String() || w.Header().Get(httpkey.ReplayedHeader) != "true" {
				t.Fatalf("replay: %d %s", w.Code, w.Body)
			}
			problemOf(t, f.do(call{key: `"k"`, body: `{"amount":2}`}), http.StatusUnprocessableEntity, httpkey.ReasonKeyReused)
			if w := f.do(call{key: `"k"`, body: `{"amount":1}`, header: map[string]string{"X-Tenant": "other"}}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
				t.Fatalf("other tenant: %d %v", w.Code, w.Header())
			}
			f.state(2, 2, 2)
			if w := f.do(call{key: `"f"`, body: `{"amount":1}`, header: map[string]string{"X-Fail": "1"}}); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("failing: %d", w.Code)
			}
			f.state(2, 2, 2)
			var wg sync.WaitGroup
			codes := make([]int, 8)
			for i := range codes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i] = f.do(call{key: `"f"`, body: `{"amount":1}`}).Code
				}()
			}
			wg.Wait()
			for _, c := range codes {
				if c != http.StatusCreated && c != http.StatusConflict {
					t.Fatalf("concurrent retries: %v", codes)
				}
			}
			// Concurrent duplicates of a completed key all get its
			// response, also those that find the key's lock taken.
			answers := make([]*httptest.ResponseRecorder, 8)
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i] = f.do(call{key: `"k"`, body: `{"amount":1}`})
				}()
			}
			wg.Wait()
			for _, a := range answers {
				if a.Body.String() != first.Body.String() || a.Header().Get(httpkey.ReplayedHeader) != "true" {
					t.Fatalf("concurrent replay: %d %s", a.Code, a.Body)
				}
			}
			if f.runs.Load() != 4 {
				t.Fatalf("handler ran %d times, want 4", f.runs.Load())
			}
			f.state(3, 3, 3)
		})
	}
}

// TestPoolOfOne: each request holds one connection at a time, so
// concurrent duplicates on a pool of one connection all finish.
func TestPoolOfOne(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			f := newFixture(t, &httpkey.Config{Wait: wait})
			pc, err := pgtest.Config(pgtest.RequireURL(t))
			if err != nil {
				t.Fatal(err)
			}
			pc.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(context.Background(), pc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			store, err := pgstore.New(pool, &pgstore.Config{Schema: f.db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			w, err := outbox.NewWriter(&outbox.Config{Schema: f.db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			mw, err := httpkey.New(store, &httpkey.Config{Wait: wait, Outbox: w,
				PrincipalFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }})
			if err != nil {
				t.Fatal(err)
			}
			f.h = mw.Wrap(http.HandlerFunc(f.pay))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			codes := make([]int, 8)
			for i := range codes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i] = f.do(call{key: fmt.Sprintf(`"p%d"`, i%2), body: `{"amount":1}`, ctx: ctx}).Code
				}()
			}
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatalf("requests on a pool of one did not finish: %v", codes)
			}
			for _, c := range codes {
				if c != http.StatusCreated && c != http.StatusConflict {
					t.Fatalf("answers %v", codes)
				}
			}
			if f.runs.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2", f.runs.Load())
			}
			f.state(2, 2, 2)
		})
	}
}

// TestTTL: a key lives Config.TTL.
func TestTTL(t *testing.T) {
	const want = 90 * time.Minute
	f := newFixture(t, &httpkey.Config{TTL: want})
	if w := f.do(call{key: `"t"`, body: `{"amount":1}`}); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	var ttl time.Duration
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT expires_at - created_at FROM "+f.db.Keys()).Scan(&ttl); err != nil {
		t.Fatal(err)
	}
	if ttl < want-time.Minute || ttl > want+time.Minute {
		t.Fatalf("key kept for %v, want %v", ttl, want)
	}
}

// TestCleanup: the store's clean-up deletes an expired key, and the same
// key is then a new request.
func TestCleanup(t *testing.T) {
	f := newFixture(t, &httpkey.Config{TTL: time.Millisecond})
	if w := f.do(call{key: `"t"`, body: `{"amount":1}`}); w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for f.keys() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("clean-up never deleted the expired key")
		}
		if _, err := f.store.Cleanup(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if w := f.do(call{key: `"t"`, body: `{"amount":1}`}); w.Code != http.StatusCreated || w.Header().Get(httpkey.ReplayedHeader) != "" {
		t.Fatalf("after clean-up: %d %v", w.Code, w.Header())
	}
	if f.runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", f.runs.Load())
	}
	f.state(2, 1, 2)
}

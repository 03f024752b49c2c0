package retry_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/httpkey/retry"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// fault is what the proxy does with one request.
type fault int

const (
	pass        fault = iota // forward the request and its answer
	dropAnswer               // forward the request, read the answer, close the client's connection
	resetAnswer              // the same, with a TCP reset
	holdAnswer               // read the answer, send nothing, keep the connection open
	dropRequest              // close the client's connection once the request is forwarded; the server's stays open
	dropBoth                 // close both connections once the request is forwarded: the server sees its client go
)

// proxy is a TCP proxy in front of an HTTP/1.1 server that reads each
// request and answer and does with the n-th request what plan[n] says
// (pass once the plan has run out).
type proxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu       sync.Mutex
	plan     []fault
	requests int
	answers  []int         // the statuses the server answered, in order
	conns    []net.Conn    // every connection, closed when the test ends
	saw409   chan struct{} // closed at the first 409
	once409  sync.Once
	// beforeDrop, when set, holds a dropBoth until it is closed.
	beforeDrop chan struct{}
}

func newProxy(t *testing.T, upstream string, plan ...fault) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, upstream: upstream, plan: plan, saw409: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.serve(c) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) next() fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if p.requests <= len(p.plan) {
		return p.plan[p.requests-1]
	}
	return pass
}

func (p *proxy) answered(code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers = append(p.answers, code)
	if code == http.StatusConflict {
		p.once409.Do(func() { close(p.saw409) })
	}
}

func (p *proxy) seen() (int, []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, append([]int(nil), p.answers...)
}

func (p *proxy) serve(client net.Conn) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		p.t.Errorf("proxy: dial the server: %v", err)
		_ = client.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, client, up)
	p.mu.Unlock()
	closeBoth := func() { _ = client.Close(); _ = up.Close() }
	cr, ur := bufio.NewReader(client), bufio.NewReader(up)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			closeBoth()
			return
		}
		f := p.next()
		if err := req.Write(up); err != nil {
			closeBoth()
			return
		}
		switch f {
		case dropRequest:
			_ = client.Close()
		case dropBoth:
			if p.beforeDrop != nil {
				select {
				case <-p.beforeDrop:
				case <-time.After(time.Minute):
				}
			}
			closeBoth()
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			closeBoth()
			return
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			closeBoth()
			return
		}
		p.answered(resp.StatusCode)
		switch f {
		case pass:
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if err := resp.Write(client); err != nil {
				closeBoth()
				return
			}
			continue
		case resetAnswer:
			_ = client.(*net.TCPConn).SetLinger(0)
		case holdAnswer:
			_ = up.Close()
			return // the client's connection stays open until the test ends
		}
		closeBoth()
		return
	}
}

// server is httpkey in front of a handler that records a payment in
// Postgres and answers 201 with its id, over real TCP.
type server struct {
	db   *pgtest.DB
	url  string
	runs atomic.Int64
	// hold, when set, runs in the handler of the n-th run after its insert.
	hold func(r *http.Request, run int64)
}

func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{db: pgtest.New(t)}
	ctx := context.Background()
	if _, err := s.db.Pool.Exec(ctx, "CREATE TABLE "+s.db.Table("payments")+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(s.db.Pool, &pgstore.Config{Schema: s.db.Schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
		t.Fatal(err)
	}
	mw, err := httpkey.New(store, &httpkey.Config{Unauthenticated: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := s.runs.Add(1)
		var p struct{ Amount int64 }
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 {
			http.Error(w, "bad payment", http.StatusBadRequest)
			return
		}
		var id int64
		if err := httpkey.Tx(r.Context()).QueryRow(r.Context(), "INSERT INTO "+s.db.Table("payments")+" (amount) VALUES ($1) RETURNING id",
			p.Amount).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if s.hold != nil {
			s.hold(r, run)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, p.Amount)
	})))
	t.Cleanup(srv.Close)
	s.url = srv.Listener.Addr().String()
	return s
}

// payments returns the ids and amounts of the payments table.
func (s *server) payments(t *testing.T) []string {
	t.Helper()
	rows, err := s.db.Pool.Query(context.Background(), "SELECT id, amount FROM "+s.db.Table("payments")+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf(`{"id":%d,"amount":%d}`, id, amount))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func client(t *testing.T, cfg *retry.Config) *http.Client {
	c := &http.Client{Transport: retry.New(&http.Transport{}, cfg)}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// pay posts one payment through c and returns the answer's status, body
// and Idempotent-Replayed header.
func pay(t *testing.T, c *http.Client, url, key, body string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(httpkey.Header, key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header.Get(httpkey.ReplayedHeader)
}

// An answer lost after the server committed (the connection closed, reset
// or silent): the retry, with the same key and body, gets the stored
// answer; the payment is made once.
func TestLostAnswerIsReplayed(t *testing.T) {
	cases := []struct {
		name  string
		fault fault
	}{
		{"closed", dropAnswer},
		{"reset", resetAnswer},
		{"never sent", holdAnswer},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t)
			p := newProxy(t, s.url, c.fault)
			code, body, replayed := pay(t, client(t, &retry.Config{AttemptTimeout: 500 * time.Millisecond}), p.url(), "", `{"amount":7}`)
			rows := s.payments(t)
			if len(rows) != 1 {
				t.Fatalf("payments %v: want one", rows)
			}
			if code != http.StatusCreated || body != rows[0] || replayed != "true" {
				t.Errorf("answer %d %s (replayed %q); want the stored 201 %s, replayed", code, body, replayed, rows[0])
			}
			if n, answers := p.seen(); n != 2 || fmt.Sprint(answers) != "[201 201]" || s.runs.Load() != 1 {
				t.Errorf("%d requests answered %v, %d handler runs; want 2 answered 201 twice, 1 run", n, answers, s.runs.Load())
			}
		})
	}
}

// The connection closes while the handler still runs, and the server does
// not see it: the retry finds the key in flight (409 with Retry-After),
// waits, and gets the stored answer once the first request committed.
func TestRetryWaitsForTheRequestInFlight(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s.url, dropRequest)
	s.hold = func(r *http.Request, run int64) {
		if run == 1 {
			select {
			case <-p.saw409:
			case <-time.After(time.Minute):
			}
		}
	}
	code, body, replayed := pay(t, client(t, nil), p.url(), "", `{"amount":9}`)
	rows := s.payments(t)
	if len(rows) != 1 {
		t.Fatalf("payments %v: want one", rows)
	}
	if code != http.StatusCreated || body != rows[0] || replayed != "true" {
		t.Errorf("answer %d %s (replayed %q); want the stored 201 %s, replayed", code, body, replayed, rows[0])
	}
	if n, answers := p.seen(); n != 3 || fmt.Sprint(answers) != "[409 201 201]" {
		t.Errorf("%d requests answered %v; want 3: the retry's 409, the first's 201, the replay", n, answers)
	}
}

// The connection closes under the handler: the server does not cut a
// request whose client went away, so the first run commits, and the
// client's retry with the same key gets its stored answer; the payment is
// made once.
func TestRetryAfterTheClientWentAway(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s.url, dropBoth)
	// The connections close once the handler runs (closed earlier, the
	// server would not start it).
	started := make(chan struct{})
	p.beforeDrop = started
	s.hold = func(r *http.Request, run int64) {
		if run == 1 {
			close(started)
			time.Sleep(200 * time.Millisecond) // the proxy drops both sides meanwhile
		}
	}
	code, body, replayed := pay(t, client(t, nil), p.url(), "", `{"amount":11}`)
	rows := s.payments(t)
	if len(rows) != 1 {
		t.Fatalf("payments %v: want one (answer %d %s; proxy %v)", rows, code, body, fmt.Sprint(p.seen()))
	}
	if code != http.StatusCreated || body != rows[0] || replayed != "true" {
		t.Errorf("answer %d %s (replayed %q); want the first run's stored 201 %s, replayed", code, body, replayed, rows[0])
	}
	if s.runs.Load() != 1 {
		t.Errorf("%d handler runs, want 1", s.runs.Load())
	}
}

// A key reused with another body gets 422, final: sent once, nothing
// applied. The caller's own key is the one sent.
func TestReusedKeyIsNotRetried(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	p := newProxy(t, s.url)
	c := client(t, nil)
	if code, _, _ := pay(t, c, p.url(), `"order-1"`, `{"amount":5}`); code != http.StatusCreated {
		t.Fatalf("first: %d, want 201", code)
	}
	code, body, _ := pay(t, c, p.url(), `"order-1"`, `{"amount":6}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, httpkey.ReasonKeyReused) {
		t.Fatalf("reuse: %d %s, want 422 %s", code, body, httpkey.ReasonKeyReused)
	}
	if n, _ := p.seen(); n != 2 {
		t.Errorf("%d requests, want 2: the 422 was retried", n)
	}
	if rows := s.payments(t); len(rows) != 1 || !strings.Contains(rows[0], `"amount":5`) {
		t.Errorf("payments %v, want the first only", rows)
	}
}

// Many requests at once, each through a proxy that drops every other
// answer: each payment is made once, and each caller gets its own.
func TestConcurrentRequestsEachOnce(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	plan := make([]fault, 40)
	for i := range plan {
		plan[i] = []fault{dropAnswer, pass, resetAnswer, pass}[i%4]
	}
	p := newProxy(t, s.url, plan...)
	c := client(t, nil)
	var wg sync.WaitGroup
	bodies := make([]string, 20)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, _ := pay(t, c, p.url(), "", fmt.Sprintf(`{"amount":%d}`, i+1))
			if code != http.StatusCreated {
				t.Errorf("payment %d: %d %s", i+1, code, body)
			}
			bodies[i] = body
		}()
	}
	wg.Wait()
	rows := s.payments(t)
	if len(rows) != len(bodies) {
		t.Fatalf("%d payments, want %d: %v", len(rows), len(bodies), rows)
	}
	got := map[string]bool{}
	for _, b := range bodies {
		got[b] = true
	}
	for _, r := range rows {
		if !got[r] {
			t.Errorf("payment %s: no caller got it", r)
		}
	}
}

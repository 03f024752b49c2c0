package retry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRetryableStatus(t *testing.T) {
	retry := []int{408, 409, 425, 429, 500, 502, 503, 504, 599}
	final := []int{200, 201, 204, 301, 304, 400, 401, 403, 404, 413, 422, 423, 501, 505}
	for _, c := range retry {
		if !RetryableStatus(c) {
			t.Errorf("RetryableStatus(%d) = false, want true", c)
		}
	}
	for _, c := range final {
		if RetryableStatus(c) {
			t.Errorf("RetryableStatus(%d) = true, want false", c)
		}
	}
}

func TestRetryableError(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: err}}
	}
	urlErr := func(err error) error { return &url.Error{Op: "Post", URL: "http://x", Err: err} }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"EOF before the answer", urlErr(io.EOF), true},
		{"connection broken", fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.ErrUnexpectedEOF), true},
		{"reset", op(syscall.ECONNRESET), true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}, true},
		{"broken pipe", op(syscall.EPIPE), true},
		{"no answer in time", errAttemptTimeout, true},
		{"DNS timeout", &net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}, true},
		{"unknown host", &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, false},
		{"canceled", urlErr(context.Canceled), false},
		{"deadline", urlErr(context.DeadlineExceeded), false},
		{"unknown authority", urlErr(x509.UnknownAuthorityError{}), false},
		{"certificate refused", &tls.CertificateVerificationError{Err: errors.New("bad")}, false},
		{"TLS to plain HTTP", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, false},
		{"unsupported scheme", errors.New(`unsupported protocol scheme "ftp"`), false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		if got := RetryableError(c.err); got != c.want {
			t.Errorf("%s: RetryableError(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{"0", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	}
	for _, c := range cases {
		got, ok := RetryAfter(c.v, now)
		if got != c.want || ok != c.ok {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

// script is a base RoundTripper that answers each attempt with the next
// of its steps (a status with an optional Retry-After, or an error) and
// records what it was sent.
type script struct {
	steps []step
	keys  []string
	body  []string
}

type step struct {
	status     int
	retryAfter string
	err        error
}

func (s *script) RoundTrip(r *http.Request) (*http.Response, error) {
	s.keys = append(s.keys, r.Header.Get(Header))
	var b []byte
	if r.Body != nil {
		b, _ = io.ReadAll(r.Body)
		_ = r.Body.Close()
	}
	s.body = append(s.body, string(b))
	st := s.steps[len(s.keys)-1]
	if st.err != nil {
		return nil, st.err
	}
	h := http.Header{}
	if st.retryAfter != "" {
		h.Set("Retry-After", st.retryAfter)
	}
	return &http.Response{StatusCode: st.status, Header: h, Body: io.NopCloser(strings.NewReader(fmt.Sprint(st.status))), Request: r}, nil
}

// run sends one POST through a Transport over s and returns the answer's
// status (or 0), the error, and the pauses the Transport took.
func run(t *testing.T, s *script, cfg *Config, req *http.Request) (int, error, []time.Duration) {
	t.Helper()
	tr := New(s, cfg)
	var waits []time.Duration
	tr.sleep = func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err, waits
	}
	defer resp.Body.Close()
	return resp.StatusCode, nil, waits
}

func post(t *testing.T, ctx context.Context, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.test/payments", body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// One key for all the attempts of a request, the body sent on each, and
// the pauses: Retry-After honoured up to MaxRetryAfter, the back-off
// between FirstDelay/2 and MaxDelay*3/2 otherwise.
func TestAttemptsShareTheKeyAndTheBody(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	s := &script{steps: []step{{err: reset}, {status: 409, retryAfter: "1"}, {status: 503, retryAfter: "120"}, {status: 429}, {status: 201}}}
	cfg := &Config{MaxAttempts: 5, FirstDelay: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond, MaxRetryAfter: 10 * time.Second}
	code, err, waits := run(t, s, cfg, post(t, context.Background(), strings.NewReader(`{"amount":5}`)))
	if err != nil || code != 201 {
		t.Fatalf("got %d, %v; want 201", code, err)
	}
	if len(s.keys) != 5 {
		t.Fatalf("%d attempts, want 5", len(s.keys))
	}
	for i, k := range s.keys {
		if k != s.keys[0] || len(k) != 38 || k[0] != '"' || k[37] != '"' {
			t.Errorf("attempt %d: key %s, want the first's %s, a quoted UUID", i+1, k, s.keys[0])
		}
		if s.body[i] != `{"amount":5}` {
			t.Errorf("attempt %d: body %q", i+1, s.body[i])
		}
	}
	if len(waits) != 4 || waits[1] != time.Second || waits[2] != 10*time.Second {
		t.Fatalf("pauses %v: want 4, the second Retry-After's 1s, the third capped at 10s", waits)
	}
	for _, i := range []int{0, 3} {
		if waits[i] < 50*time.Millisecond || waits[i] >= 600*time.Millisecond {
			t.Errorf("back-off pause %d = %v, want within [50ms, 600ms)", i+1, waits[i])
		}
	}
}

// A final answer is handed back at once, whatever its Retry-After.
func TestFinalAnswersAreNotRetried(t *testing.T) {
	for _, code := range []int{200, 201, 303, 400, 404, 422, 423, 501} {
		s := &script{steps: []step{{status: code, retryAfter: "1"}, {status: 201}}}
		got, err, _ := run(t, s, nil, post(t, context.Background(), strings.NewReader("x")))
		if err != nil || got != code || len(s.keys) != 1 {
			t.Errorf("%d: got %d, %v after %d attempts; want it back after 1", code, got, err, len(s.keys))
		}
	}
	s := &script{steps: []step{{err: &tls.CertificateVerificationError{Err: errors.New("bad")}}, {status: 201}}}
	if _, err, _ := run(t, s, nil, post(t, context.Background(), nil)); err == nil || len(s.keys) != 1 {
		t.Errorf("certificate error: %v after %d attempts; want it back after 1", err, len(s.keys))
	}
}

// Out of attempts: the last answer, or the last error naming the key.
func TestAttemptsRunOut(t *testing.T) {
	s := &script{steps: []step{{status: 503}, {status: 503}, {status: 409, retryAfter: "1"}}}
	code, err, waits := run(t, s, &Config{MaxAttempts: 3}, post(t, context.Background(), nil))
	if err != nil || code != 409 || len(s.keys) != 3 || len(waits) != 2 {
		t.Fatalf("got %d, %v after %d attempts, %d pauses; want the third's 409", code, err, len(s.keys), len(waits))
	}
	s = &script{steps: []step{{err: io.EOF}, {err: io.ErrUnexpectedEOF}}}
	_, err, _ = run(t, s, &Config{MaxAttempts: 2}, post(t, context.Background(), nil))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "2 attempts") || !strings.Contains(err.Error(), strings.Trim(s.keys[0], `"`)) {
		t.Fatalf("err = %v; want the last error, the attempts and the key", err)
	}
}

// A pause that would end past the context's deadline is not taken: the
// caller gets the answer it has.
func TestDeadlineStopsTheRetries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := &script{steps: []step{{status: 503, retryAfter: "120"}, {status: 201}}}
	code, err, waits := run(t, s, &Config{MaxRetryAfter: 5 * time.Minute}, post(t, ctx, nil))
	if err != nil || code != 503 || len(s.keys) != 1 || len(waits) != 0 {
		t.Fatalf("got %d, %v after %d attempts and pauses %v; want the 503 at once", code, err, len(s.keys), waits)
	}
}

// A caller's key is sent as it is; a safe method gets none; a body with no
// GetBody is read once and sent on each attempt.
func TestKeysAndBodies(t *testing.T) {
	req := post(t, context.Background(), nil)
	req.Header.Set(Header, `"mine"`)
	s := &script{steps: []step{{err: io.EOF}, {status: 200}}}
	if _, err, _ := run(t, s, nil, req); err != nil || s.keys[0] != `"mine"` || s.keys[1] != `"mine"` {
		t.Fatalf("keys %q, %v; want the caller's twice", s.keys, err)
	}
	if req.Header.Get(Header) != `"mine"` || len(req.Header) != 1 {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}
	get, _ := http.NewRequest(http.MethodGet, "http://example.test/payments/1", nil)
	s = &script{steps: []step{{err: io.EOF}, {status: 200}}}
	if code, err, _ := run(t, s, nil, get); code != 200 || err != nil || s.keys[0] != "" || s.keys[1] != "" {
		t.Fatalf("GET: %d, %v with keys %q; want 200 with none", code, err, s.keys)
	}
	plain := post(t, context.Background(), io.MultiReader(strings.NewReader("a"), strings.NewReader("b")))
	if plain.GetBody != nil {
		t.Fatal("the request has a GetBody: the test needs one without")
	}
	s = &script{steps: []step{{err: io.EOF}, {status: 503}, {status: 200}}}
	if _, err, _ := run(t, s, nil, plain); err != nil || strings.Join(s.body, ",") != "ab,ab,ab" {
		t.Fatalf("bodies %q, %v; want ab three times", s.body, err)
	}
}

// Package retry is an [http.RoundTripper] that makes a client's requests
// safe to retry against a server behind the Idempotency-Key middleware
// ([github.com/exactly-go/exactly/httpkey]) or any server that keeps
// Stripe's contract: it gives each logical request an Idempotency-Key and,
// when the answer is lost or says "not now", sends the same request again
// with the same key, so the server applies it once and answers the retry
// with the stored response.
//
//	client := &http.Client{Transport: retry.New(nil, nil)}
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
//	resp, err := client.Do(req) // one payment, however many attempts it took
//
// What it does with each request:
//
//   - A request with an unsafe method (anything but GET, HEAD, OPTIONS and
//     TRACE) that has no Idempotency-Key header gets a new one: a random
//     UUID as a Structured Field string ("8e03978e-…"), the form httpkey
//     accepts. A key the caller set is sent as it is, on every attempt.
//   - The body is sent again on each attempt: from Request.GetBody (set by
//     http.NewRequest for a bytes.Buffer, bytes.Reader or strings.Reader),
//     otherwise read into memory once before the first attempt.
//   - It retries, with the same key, on a network error (a refused or reset
//     connection, a connection closed before the answer came, a timeout),
//     on an answer that does not arrive within Config.AttemptTimeout, and
//     on the answers that mean "not applied, or not yet: retry": 408, 409
//     (the first request with this key is still in flight), 425, 429 and
//     the 5xx but 501 and 505. A Retry-After on such an answer is honoured,
//     up to Config.MaxRetryAfter; without one the pause is an exponential,
//     jittered back-off from Config.FirstDelay up to Config.MaxDelay.
//   - It never retries a final answer: 2xx, 3xx, 422 (the key was used for
//     another request) or any other 4xx, 501, 505; nor a TLS certificate
//     error, an unknown host or an unsupported URL.
//   - It stops after Config.MaxAttempts attempts, when the request's context
//     is done, or when the next pause would end after the context's
//     deadline: the caller then gets the last answer (a 409 or a 503 with
//     its body) or the last error.
//
// The response handed back is the transport's own: its body streams, and a
// body that breaks off after the headers arrived is the caller's to retry
// (send the request again with resp.Request's Idempotency-Key header).
// docs/http-client.md tells the whole story.
package retry

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// Config configures a Transport.
type Config struct {
	// MaxAttempts bounds the attempts of one request, the first included.
	// Defaults to 5.
	MaxAttempts int
	// FirstDelay is the pause before the second attempt when the server
	// sent no Retry-After; each later pause doubles, up to MaxDelay, and is
	// spread over [d/2, 3d/2) so that clients that failed together do not
	// retry together. Defaults to 200ms.
	FirstDelay time.Duration
	// MaxDelay caps the back-off. Defaults to 5s.
	MaxDelay time.Duration
	// MaxRetryAfter caps the pause a server asks for with Retry-After.
	// Defaults to 30s.
	MaxRetryAfter time.Duration
	// AttemptTimeout bounds the wait for one attempt's response headers:
	// past it the attempt is abandoned and the request sent again with its
	// key (the server answers 409 while the first is still running, and its
	// stored response once it has committed). Defaults to 30s.
	AttemptTimeout time.Duration
	// KeyFunc makes the key of a request that has none, without the
	// quotes: it is sent as a Structured Field string, so it must be
	// printable ASCII. Defaults to a random UUID (version 4).
	KeyFunc func() string
}

// Transport is the retrying [http.RoundTripper]. It is safe for concurrent
// use.
type Transport struct {
	base http.RoundTripper
	cfg  Config
	// sleep pauses between attempts; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// New returns a Transport that sends requests through base (nil means
// [http.DefaultTransport]). cfg may be nil; its zero fields take their
// defaults. It panics on a negative field, a programming error.
func New(base http.RoundTripper, cfg *Config) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxAttempts < 0 || c.FirstDelay < 0 || c.MaxDelay < 0 || c.MaxRetryAfter < 0 || c.AttemptTimeout < 0 {
		panic("retry: Config.MaxAttempts, FirstDelay, MaxDelay, MaxRetryAfter and AttemptTimeout must not be negative")
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.FirstDelay == 0 {
		c.FirstDelay = 200 * time.Millisecond
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 5 * time.Second
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = 30 * time.Second
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = 30 * time.Second
	}
	if c.KeyFunc == nil {
		c.KeyFunc = NewKey
	}
	return &Transport{base: base, cfg: c, sleep: clock.Sleep}
}

// NewKey returns a random UUID (version 4), the default key.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// CloseIdleConnections closes the idle connections of the base transport
// when it has such a method ([http.Client.CloseIdleConnections] calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// errAttemptTimeout ends an attempt whose answer did not come in time.
var errAttemptTimeout = errors.New("retry: no answer within Config.AttemptTimeout")

// RoundTrip sends req, with its key, until an attempt gets a final answer
// or the attempts, the context or its deadline run out.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	getBody, err := bodySource(req)
	if err != nil {
		return nil, err
	}
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	if len(header.Values(Header)) == 0 && !safe(req.Method) {
		header.Set(Header, `"`+t.cfg.KeyFunc()+`"`)
	}
	b := backoff.New(t.cfg.FirstDelay, t.cfg.MaxDelay)
	for attempt := 1; ; attempt++ {
		r := req.Clone(ctx)
		r.Header = header.Clone()
		if getBody != nil {
			if r.Body, err = getBody(); err != nil {
				return nil, fmt.Errorf("retry: body of attempt %d: %w", attempt, err)
			}
		}
		r.GetBody = getBody
		resp, err := t.attempt(r)
		if ctx.Err() != nil {
			if resp != nil {
				return resp, nil
			}
			return nil, err
		}
		var wait time.Duration
		switch {
		case err != nil && !RetryableError(err):
			return nil, err
		case err != nil:
			wait = b.Jittered()
		case !RetryableStatus(resp.StatusCode):
			return resp, nil
		default:
			wait = b.Jittered()
			if d, ok := RetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				wait = min(d, t.cfg.MaxRetryAfter)
			}
		}
		if attempt >= t.cfg.MaxAttempts || pastDeadline(ctx, wait) {
			if err != nil {
				return nil, fmt.Errorf("retry: %d attempts with %s %s: %w", attempt, Header, header.Get(Header), err)
			}
			return resp, nil
		}
		if resp != nil {
			drain(resp)
		}
		if err := t.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// attempt sends r once, abandoning it when its headers do not come within
// AttemptTimeout. A response's body keeps the attempt's context alive
// until it is closed.
func (t *Transport) attempt(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	timer := time.AfterFunc(t.cfg.AttemptTimeout, func() { cancel(errAttemptTimeout) })
	resp, err := t.base.RoundTrip(r.WithContext(ctx))
	if !timer.Stop() && errors.Is(context.Cause(ctx), errAttemptTimeout) {
		if resp != nil {
			drain(resp)
		}
		cancel(nil)
		return nil, errAttemptTimeout
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(nil) }}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// bodySource returns what gives req's body for each attempt: its GetBody,
// or a reader of the body read into memory.
func bodySource(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("retry: reading the request body: %w", err)
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

func safe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func pastDeadline(ctx context.Context, wait time.Duration) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) <= wait
}

// drain reads a little of a response that is not handed back, so that its
// connection can serve the next attempt, and closes it.
func drain(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	_ = resp.Body.Close()
}

// RetryableStatus reports whether an answer with status code means that the
// request was not applied, or not yet, and may be sent again with its key:
// 408, 409, 425, 429 and every 5xx but 501 and 505.
func RetryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return false
	}
	return code >= 500 && code <= 599
}

// RetryableError reports whether a transport error is a network failure
// worth another attempt with the same key: a refused, reset or broken
// connection, an answer that did not come (EOF, a timeout). A TLS
// certificate the client refuses, an unknown host, an unsupported URL and
// a canceled context are not.
func RetryableError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, errAttemptTimeout) {
		return true
	}
	var (
		certErr   *tls.CertificateVerificationError
		recordErr tls.RecordHeaderError
		authErr   x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalid   x509.CertificateInvalidError
		dnsErr    *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &recordErr), errors.As(err, &authErr),
		errors.As(err, &hostErr), errors.As(err, &invalid):
		return false
	case errors.As(err, &dnsErr):
		return !dnsErr.IsNotFound
	}
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.ECONNREFUSED,
		syscall.ECONNABORTED, syscall.EPIPE, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// RetryAfter parses a Retry-After value, delay-seconds or an HTTP-date
// (relative to now), into a pause of at least 0.
func RetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

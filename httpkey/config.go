package httpkey

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
)

// PrincipalFunc returns the tenant or principal a request is made for
// (an account ID, an API key's owner). Keys are scoped by it: two principals
// that send the same key never share a stored response. An error or an
// empty principal answers 401.
type PrincipalFunc func(r *http.Request) (string, error)

// RouteFunc names the target of a request for its fingerprint.
type RouteFunc func(r *http.Request) string

// KeepFunc reports whether a response with status is kept: its transaction
// commits, with the key, and requests with the same key get it back.
type KeepFunc func(status int) bool

// Config configures a Middleware.
type Config struct {
	// Scope names the keys of this middleware in the key table: requests
	// under one Scope share a key space (per principal), so one key used on
	// two routes of it is a reuse (422). A key is stored as its principal
	// (length-prefixed) and the key: "4:acme/k1". Defaults to "http".
	Scope string
	// PrincipalFunc scopes keys by the caller. Required unless
	// Unauthenticated is set.
	PrincipalFunc PrincipalFunc
	// Unauthenticated lets the middleware run without PrincipalFunc: all
	// callers then share one key space, and a caller that knows another's
	// key gets its stored response. Defaults to false.
	Unauthenticated bool
	// Optional lets a request without Idempotency-Key through: its handler
	// runs in a transaction of its own (lease mode: with none), nothing is
	// stored. Defaults to false: such a request gets 400.
	Optional bool
	// AllowBareKeys accepts a key sent without the quotes of a Structured
	// Field string (Idempotency-Key: abc, as Stripe's clients send it), as
	// long as it is made of printable ASCII with no space, quote or
	// backslash. Defaults to false: only "abc" is a key.
	AllowBareKeys bool
	// MaxKeyLen bounds a key, in characters. Defaults to 255, the most
	// the key table takes with the principal: a key with its principal
	// over 255 bytes gets 400 too.
	MaxKeyLen int
	// RouteFunc names the request's target in the fingerprint. Defaults to
	// the request's path and query (r.URL.RequestURI()), so that the same
	// body sent to /accounts/1 and /accounts/2 under one key is a reuse.
	RouteFunc RouteFunc
	// FingerprintHeaders are request headers whose values belong to the
	// fingerprint (for example a version header that changes the meaning of
	// the body). Defaults to none.
	FingerprintHeaders []string
	// MaxBodyBytes bounds a request body: a larger one gets 413 before any
	// key is claimed. Defaults to 1 MiB.
	MaxBodyBytes int64
	// ReplayHeaders are the response headers stored with the response and
	// replayed; the first response carries all the handler set. Defaults
	// to Content-Type, Content-Language and Location.
	ReplayHeaders []string
	// MaxResponseBytes bounds the body of a handler's response, which is
	// kept in memory until its transaction committed and stored with the
	// key. A larger one rolls back and answers 500. Defaults to 64 KiB.
	MaxResponseBytes int
	// KeepFunc decides which of the handler's responses are kept. A
	// response that is not kept rolls back the handler's transaction, key
	// included: the client gets it, and its retry runs the handler again.
	// Defaults to status < 500 but the answers that say "not now" (408,
	// 423, 425, 429, and any response with a Retry-After header): the
	// handler's 2xx, 3xx and other 4xx are stored and replayed; its 5xx and
	// its "not now" answers are not. A KeepFunc of yours decides by the
	// status alone.
	KeepFunc KeepFunc
	// Wait makes a request whose key is in flight (its first request's
	// transaction has not ended) wait for it and then get its stored
	// response, or run if it rolled back. Defaults to false: 409 with
	// Retry-After at once. Lease mode always answers 409 while leased.
	Wait bool
	// RetryAfter is the Retry-After of a 409 in transactional mode, and of
	// a 503 when the database failed. Defaults to 1s.
	RetryAfter time.Duration
	// Lease switches to lease mode when positive: the handler runs outside
	// any transaction (it calls a payment provider, say) under a lease of
	// this length; a duplicate gets 409 until the lease ends, and after it
	// (the process died) a retry takes the key over and runs the handler
	// again. Tx and WriteOutbox are not available to the handler. Defaults
	// to 0: transactional mode.
	Lease time.Duration
	// TTL is how long a key is kept. Defaults to the store's TTL.
	TTL time.Duration
	// Outbox, when set, lets the handler write messages to the outbox in
	// its transaction with WriteOutbox; a relay (outbox.NewRelay, or a
	// worker's on the same schema) publishes them. Defaults to nil.
	Outbox *outbox.Writer
	// GoneTimeout bounds a request's work once its connection is gone
	// (the client went away or half-closed its side, or the server's Close
	// closed it): the request goes on to its end, so that what it started
	// commits or rolls back whole and the client's retry finds its answer,
	// for this long at most; then its context ends and what has not
	// committed rolls back. Defaults to 30s.
	GoneTimeout time.Duration
	// StaleOutbox: after a request that wrote to the outbox, the middleware
	// reads the outbox's backlog (at most every 30s, in the background) and
	// logs a WARN when its oldest pending message has waited longer than
	// this: no relay publishes it. It reads on the store's Pool, so a
	// store without one (consumertest.MemStore) watches nothing. Its gauge
	// is plugin/eprom's WatchOutbox of Config.Outbox.Backlog(pool).
	// Defaults to 1 minute.
	StaleOutbox time.Duration
	// Logger receives failures of the database. Defaults to slog.Default().
	Logger *slog.Logger
}

const (
	defaultMaxBody     = 1 << 20
	defaultMaxResponse = 64 << 10
)

func (c *Config) withDefaults() (Config, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.Scope == "" {
		o.Scope = "http"
	}
	if err := (dedupe.Key{Scope: o.Scope, ID: "x"}).Validate(); err != nil {
		return o, fmt.Errorf("httpkey: Config.Scope: %w", err)
	}
	if o.PrincipalFunc == nil && !o.Unauthenticated {
		return o, errors.New("httpkey: Config.PrincipalFunc is nil: set it to a function returning the request's tenant or " +
			"principal, so that one client never gets another's response, or set Config.Unauthenticated")
	}
	if o.MaxKeyLen == 0 {
		o.MaxKeyLen = dedupe.MaxKeyLen
	}
	if o.MaxKeyLen < 1 || o.MaxKeyLen > dedupe.MaxKeyLen {
		return o, fmt.Errorf("httpkey: Config.MaxKeyLen %d: want 1 to %d", o.MaxKeyLen, dedupe.MaxKeyLen)
	}
	if o.RouteFunc == nil {
		o.RouteFunc = func(r *http.Request) string { return r.URL.RequestURI() }
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = defaultMaxBody
	}
	if o.MaxBodyBytes < 0 {
		return o, fmt.Errorf("httpkey: Config.MaxBodyBytes %d: want > 0", o.MaxBodyBytes)
	}
	if o.ReplayHeaders == nil {
		o.ReplayHeaders = []string{"Content-Type", "Content-Language", "Location"}
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = defaultMaxResponse
	}
	if o.MaxResponseBytes < 0 {
		return o, fmt.Errorf("httpkey: Config.MaxResponseBytes %d: want > 0", o.MaxResponseBytes)
	}
	if o.GoneTimeout == 0 {
		o.GoneTimeout = 30 * time.Second
	}
	if o.StaleOutbox == 0 {
		o.StaleOutbox = time.Minute
	}
	if o.RetryAfter == 0 {
		o.RetryAfter = time.Second
	}
	if o.RetryAfter < 0 || o.Lease < 0 || o.TTL < 0 || o.GoneTimeout < 0 || o.StaleOutbox < 0 {
		return o, errors.New("httpkey: Config.RetryAfter, Lease, TTL, GoneTimeout and StaleOutbox must not be negative")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

package httpkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/txguard"
	"github.com/exactly-go/exactly/outbox"
)

// Middleware makes POST (or any) handlers idempotent under the
// Idempotency-Key request header. It is safe for concurrent use.
type Middleware struct {
	store Store
	cfg   Config
	ready atomic.Bool // the store's Check passed

	backlog     *outbox.Backlog // Config.Outbox's, read now and then
	lastBacklog atomic.Int64    // when it was last read, in Unix nanoseconds
}

// New returns a Middleware that keeps its keys in store, a
// [*pgstore.Store] (its table, TTL and clean-up: run the store's Cleanup,
// or RunCleanup, as for a consumer), or consumertest.MemStore in a unit
// test. The store's Check runs before the first request's transaction
// (pgstore's starts the partitioned layout and creates its first
// partitions; call it at start-up to fail fast). cfg must set
// PrincipalFunc, or Unauthenticated.
func New(store Store, cfg *Config) (*Middleware, error) {
	if isNil(store) {
		return nil, errors.New("httpkey: store is nil")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// A stored response is JSON: the body in base64 and the headers.
	if need := c.MaxResponseBytes/3*4 + 8<<10; need > store.MaxResultBytes() {
		return nil, fmt.Errorf("httpkey: Config.MaxResponseBytes %d does not fit the store's MaxResultBytes %d once encoded "+
			"(it takes about %d): lower it or raise pgstore.Config.MaxResultBytes", c.MaxResponseBytes, store.MaxResultBytes(), need)
	}
	m := &Middleware{store: store, cfg: c}
	if p, ok := store.(pooled); ok && c.Outbox != nil {
		if m.backlog, err = c.Outbox.Backlog(p.Pool()); err != nil {
			return nil, fmt.Errorf("httpkey: Config.Outbox: %w", err)
		}
	}
	return m, nil
}

// Wrap returns h behind the middleware.
func (m *Middleware) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, h) })
}

// request is one request's parsed state.
type request struct {
	r         *http.Request
	wrote     atomic.Bool // the handler wrote to the outbox
	body      []byte
	key       string
	principal string
	req       dedupe.Request
}

// detach returns a context with ctx's values and deadline that a cancel of
// ctx (its connection gone) ends only gone later.
func detach(ctx context.Context, gone time.Duration) (context.Context, context.CancelFunc) {
	base, cancelBase := context.WithCancelCause(context.WithoutCancel(ctx))
	d, cancelDeadline := context.Context(base), context.CancelFunc(func() {})
	if deadline, ok := ctx.Deadline(); ok {
		d, cancelDeadline = context.WithDeadline(base, deadline)
	}
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return // d has the deadline too
		}
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(gone, func() {
			cancelBase(fmt.Errorf("httpkey: the request's connection was gone for Config.GoneTimeout (%v)", gone))
		})
	})
	return d, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancelDeadline()
		cancelBase(context.Canceled)
	}
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, h http.Handler) {
	key, err := parseKey(r.Header.Values(Header), m.cfg.MaxKeyLen, m.cfg.AllowBareKeys)
	switch {
	case errors.Is(err, errNoKey) && m.cfg.Optional:
	case errors.Is(err, errNoKey):
		writeProblem(w, http.StatusBadRequest, ReasonKeyMissing, "this request needs an Idempotency-Key header: a string such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\", new for each operation and the same on its retries")
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, ReasonKeyMalformed, err.Error())
		return
	}
	var principal string
	if m.cfg.PrincipalFunc != nil {
		p, err := m.cfg.PrincipalFunc(r)
		if err != nil || p == "" {
			detail := "the request has no principal to scope its key by"
			if err != nil {
				detail = err.Error()
			}
			writeProblem(w, http.StatusUnauthorized, ReasonNoPrincipal, detail)
			return
		}
		if err := (dedupe.Key{Scope: "p", ID: p}).Validate(); err != nil {
			var ik *dedupe.InvalidKeyError
			reason := err.Error()
			if errors.As(err, &ik) {
				reason = strings.TrimPrefix(ik.Reason, "id ")
			}
			writeProblem(w, http.StatusUnauthorized, ReasonPrincipalInvalid, "the request's principal cannot scope a key: it "+reason)
			return
		}
		principal = p
	}
	if r.ContentLength > m.cfg.MaxBodyBytes {
		writeProblem(w, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, fmt.Sprintf("the body is over %d bytes", m.cfg.MaxBodyBytes))
		return
	}
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
		if err != nil {
			writeProblem(w, http.StatusBadRequest, ReasonBodyUnread, "reading the body: "+err.Error())
			return
		}
		if int64(len(body)) > m.cfg.MaxBodyBytes {
			writeProblem(w, http.StatusRequestEntityTooLarge, ReasonBodyTooLarge, fmt.Sprintf("the body is over %d bytes", m.cfg.MaxBodyBytes))
			return
		}
	}
	// The request's work is detached from its client: a client that goes
	// away (or half-closes its side) once its request is read does not
	// cut it, so what it started commits or rolls back whole, and a retry
	// with its key finds the answer. A deadline of the request's (an outer
	// middleware's timeout) still bounds it, and so does GoneTimeout once
	// the connection is gone (the server's Close, too).
	ctx, cancel := detach(r.Context(), m.cfg.GoneTimeout)
	defer cancel()
	q := &request{r: r.WithContext(ctx), body: body, key: key, principal: principal}
	defer func() {
		if q.wrote.Load() {
			m.checkBacklog(ctx)
		}
	}()
	if key == "" {
		m.serveWithoutKey(w, q, h)
		return
	}
	q.req = dedupe.Request{
		Key:         dedupe.Key{Scope: m.cfg.Scope, ID: scopedID(principal, key)},
		Fingerprint: fingerprint(r, m.cfg.RouteFunc(r), body, m.cfg.FingerprintHeaders),
		TTL:         m.cfg.TTL,
	}
	if len(q.req.Key.ID) > dedupe.MaxKeyLen {
		writeProblem(w, http.StatusBadRequest, ReasonKeyMalformed, fmt.Sprintf("the Idempotency-Key is too long for this "+
			"principal: %d characters at most", dedupe.MaxKeyLen-(len(q.req.Key.ID)-len(key))))
		return
	}
	var (
		rec *recorder
		c   dedupe.Claim
	)
	switch {
	case m.cfg.Lease > 0:
		rec, c, err = m.runLease(q, h)
	case m.cfg.Wait:
		rec, c, err = m.runWait(q, h)
	default:
		rec, c, err = m.runTx(q, h)
	}
	m.answer(w, q, rec, c, err)
}

// backlogEvery is how often at most the outbox's backlog is read.
const backlogEvery = 30 * time.Second

// checkBacklog reads the outbox's backlog, at most every backlogEvery, in
// the background, and warns when its oldest pending message has waited
// longer than Config.StaleOutbox: no relay publishes the outbox the
// handlers write to, or it cannot publish.
func (m *Middleware) checkBacklog(ctx context.Context) {
	now := time.Now().UnixNano()
	last := m.lastBacklog.Load()
	every := min(backlogEvery, m.cfg.StaleOutbox/2)
	if m.backlog == nil || now-last < int64(every) || !m.lastBacklog.CompareAndSwap(last, now) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		st, err := m.backlog.Stats(ctx)
		if err != nil || st.Pending == 0 || st.Lag < m.cfg.StaleOutbox {
			return
		}
		m.cfg.Logger.WarnContext(ctx, "httpkey: the outbox's oldest pending message has waited longer than Config.StaleOutbox: "+
			"no relay publishes it (run outbox.NewRelay beside the API, or a worker on this schema), or it cannot publish "+
			"(see the relay's log)", "pending", st.Pending, "oldest", st.Lag.Round(time.Second), "dead", st.Dead)
	}()
}

// StoredKey is the key in the key table of the Idempotency-Key key sent
// by principal to a Middleware of Config.Scope scope (the console's key
// lookup reads it with pgstore.Store.Get).
func StoredKey(scope, principal, key string) dedupe.Key {
	return dedupe.Key{Scope: scope, ID: scopedID(principal, key)}
}

// scopedID is the stored ID of key sent by principal: the principal,
// length-prefixed so that no principal and key pair reads as another,
// then the key ("4:acme/k1").
func scopedID(principal, key string) string {
	return strconv.Itoa(len(principal)) + ":" + principal + "/" + key
}

// handle runs h on a copy of q's request whose body is q.body again and
// whose context carries st, and returns its response or why it is not to
// be stored.
func (m *Middleware) handle(ctx context.Context, q *request, h http.Handler, st *state) (*recorder, []byte, error) {
	st.key, st.scopedID, st.m, st.wrote = q.key, q.req.Key.ID, m, &q.wrote
	var guard *txguard.Tx
	if st.tx != nil {
		guard = txguard.Wrap(st.tx, "the HTTP handler")
		defer guard.End()
		st.tx = guard
	}
	r := q.r.WithContext(withState(ctx, st))
	r.Body = io.NopCloser(bytes.NewReader(q.body))
	r.ContentLength = int64(len(q.body))
	rec := newRecorder(m.cfg.MaxResponseBytes)
	h.ServeHTTP(rec, r)
	aborted := false
	if guard != nil {
		if err := guard.Check(nil); err != nil && guard.Ended() {
			return rec, nil, fmt.Errorf("%w: %w", errEndedOnConn, err)
		} else if err != nil {
			aborted = guard.Aborted()
			if !aborted || rec.code() < 400 {
				// A success on writes that a failed statement undid, or a
				// transaction the handler ended: nothing to keep.
				return rec, nil, err
			}
		}
	}
	if rec.over {
		return rec, nil, errResponseLarge
	}
	if !m.keep(rec) {
		return rec, nil, &notKept{rec: rec}
	}
	result, err := rec.encode(m.cfg.ReplayHeaders)
	if err == nil && aborted {
		return rec, result, &abortedAnswer{rec: rec, result: result}
	}
	return rec, result, err
}

// keep reports whether rec is kept: KeepFunc's say, or by default any
// status below 500 but the 4xx that say "not now" (408, 423, 425, 429, or
// any 4xx with Retry-After), which a retry of the same key must run again.
// A 2xx with Retry-After (202 Accepted, poll later) is kept: it reports
// work that commits.
func (m *Middleware) keep(rec *recorder) bool {
	code := rec.code()
	if m.cfg.KeepFunc != nil {
		return m.cfg.KeepFunc(code)
	}
	switch code {
	case http.StatusRequestTimeout, http.StatusLocked, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return code < 400 || (code < 500 && rec.header.Get("Retry-After") == "")
}

// serveWithoutKey runs h for a request without a key (Config.Optional):
// in a transaction of its own that stores nothing, or in lease mode in none.
func (m *Middleware) serveWithoutKey(w http.ResponseWriter, q *request, h http.Handler) {
	ctx := q.r.Context()
	if m.cfg.Lease > 0 {
		rec, _, err := m.handle(ctx, q, h, &state{})
		if errors.Is(err, errResponseLarge) {
			rec, err = tooLarge(rec, m.cfg.MaxResponseBytes), nil
		}
		m.answer(w, q, rec, dedupe.Claim{}, err)
		return
	}
	tx, err := m.store.Begin(ctx)
	if err != nil {
		m.answer(w, q, nil, dedupe.Claim{}, err)
		return
	}
	defer pgtx.Rollback(ctx, tx)
	rec, _, err := m.handle(ctx, q, h, &state{tx: tx})
	var aa *abortedAnswer
	if errors.As(err, &aa) {
		// Rolled back, nothing to store: the client gets the answer.
		err = &notKept{rec: aa.rec}
	}
	if err == nil {
		if err = tx.Commit(ctx); err != nil {
			err = fmt.Errorf("httpkey: commit: %w", err)
		}
	}
	m.answer(w, q, rec, dedupe.Claim{}, err)
}

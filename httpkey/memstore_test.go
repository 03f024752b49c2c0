package httpkey_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/pgstore"
)

var _ httpkey.Store = (*pgstore.Store)(nil)

// ledger is an HTTP handler's fake dependency: the charges it made. In
// transactional mode a charge counts once the request's transaction
// commits (consumertest.TxOf(tx).OnCommit), as a row it inserted would.
type ledger struct {
	mu      sync.Mutex
	charges []string
}

func (l *ledger) add(body string) {
	l.mu.Lock()
	l.charges = append(l.charges, body)
	l.mu.Unlock()
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.charges)
}

// TestHandlerOnMemStore tests an HTTP handler behind the middleware on
// consumertest.MemStore, without Postgres, in both modes: the first
// request runs it, a retry gets the stored answer, a request while the
// first is in flight gets 409, another request with the key gets 422, and
// a 5xx keeps nothing, so its retry runs the handler again.
func TestHandlerOnMemStore(t *testing.T) {
	for _, lease := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			t.Parallel()
			store := consumertest.NewMemStore(nil)
			mw, err := httpkey.New(store, &httpkey.Config{
				Lease:         lease,
				Logger:        slog.New(slog.DiscardHandler),
				PrincipalFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			var (
				l       ledger
				hold    = make(chan struct{}) // the request with body "hold" waits for it
				entered = make(chan struct{})
			)
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				body := string(b)
				switch body {
				case "hold":
					close(entered)
					<-hold
				case "fail":
					http.Error(w, "provider down", http.StatusBadGateway)
					return
				}
				if tx := httpkey.Tx(r.Context()); tx != nil {
					consumertest.TxOf(tx).OnCommit(func() { l.add(body) })
				} else if lease > 0 {
					l.add(body)
				} else {
					t.Error("no transaction in transactional mode")
				}
				w.Header().Set("Location", "/charges/"+body)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "charged %s", body)
			}))
			doCtx := func(ctx context.Context, key, body string) *httptest.ResponseRecorder {
				r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", strings.NewReader(body))
				r.Header.Set("X-Tenant", "acme")
				r.Header.Set(httpkey.Header, key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			do := func(key, body string) *httptest.ResponseRecorder { return doCtx(context.Background(), key, body) }

			first := do(`"k1"`, "a")
			if first.Code != http.StatusCreated || first.Body.String() != "charged a" || first.Header().Get(httpkey.ReplayedHeader) != "" {
				t.Fatalf("first: %d %v %q", first.Code, first.Header(), first.Body)
			}
			again := do(`"k1"`, "a")
			if again.Code != http.StatusCreated || again.Body.String() != "charged a" ||
				again.Header().Get(httpkey.ReplayedHeader) != "true" || again.Header().Get("Location") != "/charges/a" {
				t.Fatalf("retry: %d %v %q, want the stored answer", again.Code, again.Header(), again.Body)
			}
			problemOf(t, do(`"k1"`, "b"), http.StatusUnprocessableEntity, httpkey.ReasonKeyReused)
			if n := l.count(); n != 1 {
				t.Fatalf("%d charges after a run, its retry and a reuse; want 1", n)
			}

			held := make(chan *httptest.ResponseRecorder)
			go func() { held <- do(`"k2"`, "hold") }()
			<-entered
			// A store that made it wait for the first request would
			// answer 503 at this deadline instead of 409.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			busy := doCtx(ctx, `"k2"`, "hold")
			cancel()
			problemOf(t, busy, http.StatusConflict, httpkey.ReasonInFlight)
			if busy.Header().Get("Retry-After") == "" {
				t.Fatalf("409 without Retry-After: %v", busy.Header())
			}
			close(hold)
			if w := <-held; w.Code != http.StatusCreated || w.Body.String() != "charged hold" {
				t.Fatalf("held request: %d %q", w.Code, w.Body)
			}
			if w := do(`"k2"`, "hold"); w.Header().Get(httpkey.ReplayedHeader) != "true" || w.Body.String() != "charged hold" {
				t.Fatalf("retry after the held request: %d %v %q", w.Code, w.Header(), w.Body)
			}

			for range 2 {
				if w := do(`"k3"`, "fail"); w.Code != http.StatusBadGateway || w.Header().Get(httpkey.ReplayedHeader) != "" {
					t.Fatalf("failing request: %d %v %q, want its own 502 each time", w.Code, w.Header(), w.Body)
				}
			}
			if n := l.count(); n != 2 {
				t.Fatalf("%d charges, want 2 (a, hold)", n)
			}
		})
	}
}

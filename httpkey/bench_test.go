package httpkey_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// BenchmarkMiddleware runs one handler (a transaction that writes one
// row) without the middleware and behind it, side by side: compare the
// sub-benchmarks' ns/op.
//
//	go test -run X -bench Middleware -count 6 ./httpkey
func BenchmarkMiddleware(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	table := db.Table("payments")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	// The handler writes in the middleware's transaction, or in one of
	// its own when there is none.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		write := func(tx pgx.Tx) error {
			var id int64
			return tx.QueryRow(ctx, "INSERT INTO "+table+" (amount) VALUES ($1) RETURNING id", 1).Scan(&id)
		}
		if tx := httpkey.Tx(ctx); tx != nil {
			if err := write(tx); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		} else {
			tx, err := db.Pool.Begin(ctx)
			if err == nil {
				defer pgtx.Rollback(ctx, tx)
				if err = write(tx); err == nil {
					err = tx.Commit(ctx)
				}
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	one := func(b *testing.B, h http.Handler, key string) time.Duration {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(httpkey.Header, `"`+key+`"`)
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(start)
		if w.Code != http.StatusCreated {
			b.Fatalf("%d %s", w.Code, w.Body)
		}
		return d
	}
	run := func(b *testing.B, h http.Handler) {
		for i := 0; b.Loop(); i++ {
			one(b, h, b.Name()+strconv.Itoa(i))
		}
	}
	b.Run("plain", func(b *testing.B) { run(b, handler) })
	for _, c := range []struct {
		name string
		wait bool
	}{{"httpkey", false}, {"httpkey-wait", true}} {
		mw, err := httpkey.New(store, &httpkey.Config{Unauthenticated: true, Wait: c.wait})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) { run(b, mw.Wrap(handler)) })
	}
	// The same two, one request of each in turn, so that both see the same
	// load on a shared machine: ratio is the middleware's throughput over
	// the plain handler's (plain-ns/req over httpkey-ns/req).
	mw, err := httpkey.New(store, &httpkey.Config{Unauthenticated: true})
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw.Wrap(handler)
	b.Run("interleaved", func(b *testing.B) {
		var plain, keyed time.Duration
		for i := 0; b.Loop(); i++ {
			plain += one(b, handler, "")
			keyed += one(b, wrapped, b.Name()+strconv.Itoa(i))
		}
		b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "plain-ns/req")
		b.ReportMetric(float64(keyed.Nanoseconds())/float64(b.N), "httpkey-ns/req")
		b.ReportMetric(float64(plain)/float64(keyed), "ratio")
	})
}

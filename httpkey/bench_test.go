package httpkey_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// BenchmarkMiddleware runs one handler (a transaction that writes one
// row) without the middleware and behind it, on one connection: compare
// the sub-benchmarks' ns/op, or read interleaved's ratio, both sides in
// turn (the figure docs/performance.md records):
//
//	go test -run X -bench Middleware/interleaved -benchtime 2000x -count 3 ./httpkey
func BenchmarkMiddleware(b *testing.B) {
	db := pgtest.New(b)
	ctx := context.Background()
	table := db.Table("payments")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	// One connection for both sides: with more, a side can keep to a server
	// process of its own, whose speed on a shared machine is its own too.
	cfg, err := pgtest.Config(pgtest.RequireURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	store, err := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
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
			tx, err := pool.Begin(ctx)
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
	// The same two, one request of each in turn (which goes first
	// alternates), so that both see the same load on a shared machine, on
	// the same pool (both sides' connections warmed up first): ratio is the
	// middleware's throughput over the plain handler's, from the median
	// request of each side (plain's median time over httpkey's), which a
	// stall of the machine in one request does not move; ratio-mean is the
	// same from the mean times. Run with many alternations:
	//
	//	go test -run X -bench Middleware/interleaved -benchtime 2000x -count 3 ./httpkey
	mw, err := httpkey.New(store, &httpkey.Config{Unauthenticated: true})
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw.Wrap(handler)
	b.Run("interleaved", func(b *testing.B) {
		// Keys of this run only: a key used before is answered from its
		// stored response, without the handler's transaction.
		run := uuid.NewString()
		for i := range 200 { // warm-up: the pool's connection, prepared statements
			one(b, handler, "")
			one(b, wrapped, run+"-warm-"+strconv.Itoa(i))
		}
		var plain, keyed []time.Duration
		for i := 0; b.Loop(); i++ {
			key := run + "-" + strconv.Itoa(i)
			if i%2 == 0 {
				plain = append(plain, one(b, handler, ""))
				keyed = append(keyed, one(b, wrapped, key))
			} else {
				keyed = append(keyed, one(b, wrapped, key))
				plain = append(plain, one(b, handler, ""))
			}
		}
		sum := func(ds []time.Duration) (t time.Duration) {
			for _, d := range ds {
				t += d
			}
			return t
		}
		median := func(ds []time.Duration) time.Duration {
			slices.Sort(ds)
			return ds[len(ds)/2]
		}
		b.ReportMetric(float64(sum(plain).Nanoseconds())/float64(b.N), "plain-ns/req")
		b.ReportMetric(float64(sum(keyed).Nanoseconds())/float64(b.N), "httpkey-ns/req")
		b.ReportMetric(float64(sum(plain))/float64(sum(keyed)), "ratio-mean")
		b.ReportMetric(float64(median(plain))/float64(median(keyed)), "ratio")
	})
}

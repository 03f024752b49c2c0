package httpkey_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// roundTrips counts the round trips of a pool's connections: a query, a
// batch (one round trip once its statements are prepared) or a prepare.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// TestRoundTrips: on a pgstore.Store, a new key in transactional mode
// costs the round trips of the handler's own transaction without the
// middleware (BEGIN, its statement, COMMIT), on both layouts: BEGIN goes
// with the key's lock and claim, the response with COMMIT.
func TestRoundTrips(t *testing.T) {
	for _, layout := range []pgstore.Layout{pgstore.LayoutPartitioned, pgstore.LayoutSingleTable} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			ctx := context.Background()
			table := db.Table("payments")
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			cfg, err := pgtest.Config(pgtest.RequireURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			trips := &roundTrips{}
			cfg.ConnConfig.Tracer = trips
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			store, err := pgstore.New(pool, &pgstore.Config{Schema: db.Schema, Layout: layout, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Check(ctx); err != nil {
				t.Fatal(err)
			}
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				tx := httpkey.Tx(ctx)
				own := tx == nil
				if own {
					var err error
					if tx, err = pool.Begin(ctx); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					defer pgtx.Rollback(ctx, tx)
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (amount) VALUES ($1)", 1); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if own {
					if err := tx.Commit(ctx); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"ok":true}`))
			})
			mw, err := httpkey.New(store, &httpkey.Config{Unauthenticated: true})
			if err != nil {
				t.Fatal(err)
			}
			wrapped := mw.Wrap(handler)
			// serve sends n requests with new keys (or none, to the plain
			// handler) and returns the round trips they took.
			serve := func(h http.Handler, n int) int64 {
				t.Helper()
				before := trips.n.Load()
				for range n {
					r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
					r.Header.Set(httpkey.Header, `"`+uuid.NewString()+`"`)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					if w.Code != http.StatusCreated {
						t.Fatalf("%d %s", w.Code, w.Body)
					}
				}
				return trips.n.Load() - before
			}
			serve(handler, 3) // statements prepared, the layout's state read
			serve(wrapped, 3)
			const n = 10
			plain, keyed := serve(handler, n), serve(wrapped, n)
			if plain != 3*n {
				t.Fatalf("the plain handler took %d round trips for %d requests, want %d", plain, n, 3*n)
			}
			if keyed != plain {
				t.Fatalf("the middleware took %d round trips for %d requests, the plain handler %d", keyed, n, plain)
			}
		})
	}
}

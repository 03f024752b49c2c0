package httpkey_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// A top-up endpoint that a client may retry: the balance, the key, the
// stored response and the event for Kafka commit together, once.
func Example() {
	ctx := context.Background()
	pool, schema, drop := pgtest.ExampleDB() // your pool, and the schema your tables live in
	defer drop()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		panic(err)
	}
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+accounts+" (id text PRIMARY KEY, balance bigint NOT NULL); "+
		"INSERT INTO "+accounts+" VALUES ('acc-1', 0)"); err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := store.Check(ctx); err != nil {
		panic(err)
	}
	events, err := outbox.NewWriter(&outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	mw, err := httpkey.New(store, &httpkey.Config{
		// Keys are the caller's own: here the account of an API key.
		PrincipalFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		Outbox:        events,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/topup", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var balance int64
		if err := httpkey.Tx(ctx).QueryRow(ctx, "UPDATE "+accounts+" SET balance = balance + 10 WHERE id = $1 RETURNING balance",
			r.PathValue("id")).Scan(&balance); err != nil {
			http.Error(w, "no such account", http.StatusNotFound) // a 4xx is stored and replayed too
			return
		}
		if err := httpkey.WriteOutbox(ctx, "ledger.events", message.NewMessage("", fmt.Appendf(nil, "topup %s", r.PathValue("id")))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // a 5xx rolls back: the retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"balance":%d}`, balance)
	})))

	post := func(key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/accounts/acc-1/topup", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Account", "acc-1")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		b, _ := io.ReadAll(w.Body)
		if w.Header().Get("Content-Type") == "application/problem+json" {
			var p httpkey.Problem
			_ = json.Unmarshal(b, &p)
			b = []byte(p.Reason)
		}
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), string(b))
	}
	post(`"3f6c1e1a"`, `{"amount":10}`)
	post(`"3f6c1e1a"`, `{ "amount": 10 }`) // the client's retry
	post(`"3f6c1e1a"`, `{"amount":99}`)    // the key reused for another request
	post(`3f6c1e1a`, `{"amount":10}`)      // not a Structured Field string

	var balance, msgs int64
	if err := pool.QueryRow(ctx, "SELECT (SELECT balance FROM "+accounts+"), (SELECT count(*) FROM "+
		pgx.Identifier{schema, "exactly_outbox"}.Sanitize()+")").Scan(&balance, &msgs); err != nil {
		panic(err)
	}
	fmt.Println("balance:", balance, "events:", msgs)
	// Output:
	// 201  {"balance":10}
	// 201 true {"balance":10}
	// 422  idempotency-key-reused
	// 400  idempotency-key-malformed
	// balance: 10 events: 1
}

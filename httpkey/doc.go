// Package httpkey is a net/http middleware for the Idempotency-Key request
// header (the IETF httpapi draft "The Idempotency-Key HTTP Header Field",
// as Stripe's API practises it), on the same Postgres key store as the
// Kafka consumers ([github.com/exactly-go/exactly/pgstore]).
//
// A request's key, its handler's writes, the outbox messages it emits
// and its response commit in one transaction: a client's retry either
// finds the stored response (replayed with Idempotent-Replayed: true) or
// runs the handler again because nothing of the first attempt committed.
//
//	store, _ := pgstore.New(pool, &pgstore.Config{Schema: "shop"})
//	_ = store.Check(ctx)
//	w, _ := outbox.NewWriter(&outbox.Config{Schema: "shop"})
//	mw, _ := httpkey.New(store, &httpkey.Config{
//		PrincipalFunc: func(r *http.Request) (string, error) { return accountOf(r) },
//		Outbox:        w,
//	})
//	mux.Handle("POST /payments", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := httpkey.Tx(r.Context()) // the transaction that holds the key
//		_, err := tx.Exec(r.Context(), "INSERT INTO shop.payments …")
//		…
//		_ = httpkey.WriteOutbox(r.Context(), "payments", message.NewMessage("", event))
//		w.WriteHeader(http.StatusCreated)
//	})))
//
// Answers of the middleware itself carry an RFC 9457 problem details
// body ([Problem]): 400 for a missing or malformed key, 401 without a
// principal, 413 for a body over Config.MaxBodyBytes (before any claim),
// 422 for a key reused with another request, 409 with Retry-After for a
// key in flight (or, with Config.Wait, the first request's answer once it
// ends), 503 with Retry-After when the database failed or the request's
// deadline passed before its outcome was written ("not applied, retry with
// the same key"), 500 for what no retry mends (the database refusing the
// transaction for good, a handler that ended its transaction). Only a
// request that committed is answered with the handler's 2xx; a client that
// goes away does not cut its request, which commits or rolls back whole.
//
// The handler's 5xx and its "not now" answers (408, 423, 425, 429, any
// with Retry-After; see Config.KeepFunc) roll back its transaction with the
// key, so its retry runs again; its other responses are stored with the key
// and replayed. Messages written with WriteOutbox get IDs that are the same
// when the request is applied again ([MessageID]). Handlers with effects outside
// the database run in lease mode (Config.Lease). docs/http.md compares
// the behaviour with the draft and with Stripe's, point by point.
//
// The middleware reaches its keys through [Store], which pgstore's Store
// implements; consumertest.MemStore implements it in memory, so a handler
// that writes no SQL can be unit-tested without Postgres.
package httpkey

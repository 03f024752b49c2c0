package pgstore_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

// Apply a top-up exactly once, however often its command arrives. (Compile
// only: it needs a Postgres server.)
func ExampleStore_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: "ledger"}); err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: "ledger"})
	if err != nil {
		panic(err)
	}
	payload := []byte(`{"account":"acc-1","amount":10}`)
	key, err := dedupe.NewKey("topups", "cmd-0001")
	if err != nil {
		panic(err) // permanent: dead-letter it
	}
	claim, err := store.Do(ctx, dedupe.Request{Key: key, Fingerprint: dedupe.FingerprintOf(payload)},
		func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := tx.Exec(ctx, "UPDATE ledger.accounts SET balance = balance + 10 WHERE id = 'acc-1'")
			return []byte("ok"), err
		})
	switch {
	case dedupe.IsPermanent(err):
		fmt.Println("never applied:", err) // e.g. the key was reused with another payload
	case err != nil:
		fmt.Println("try again later:", err)
	default:
		fmt.Println(claim.Decision, string(claim.Record.Result)) // "new ok", then "duplicate ok"
	}
}

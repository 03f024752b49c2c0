package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

// Apply a top-up exactly once, however often its command arrives: the
// second delivery is a duplicate that gets the first run's result back, and
// the same key with another payload is refused, never applied.
func ExampleStore_Do() {
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

	topUp := func(id string, payload []byte) {
		key, err := dedupe.NewKey("topups", id)
		if err != nil {
			panic(err) // permanent: dead-letter it
		}
		claim, err := store.Do(ctx, dedupe.Request{Key: key, Fingerprint: dedupe.FingerprintOf(payload)},
			func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				var balance int64
				err := tx.QueryRow(ctx, "UPDATE "+accounts+" SET balance = balance + 10 WHERE id = 'acc-1' RETURNING balance").Scan(&balance)
				return fmt.Appendf(nil, "balance %d", balance), err
			})
		switch {
		case dedupe.IsPermanent(err):
			fmt.Println("never applied, key reused:", errors.Is(err, dedupe.ErrKeyReused))
		case err != nil:
			fmt.Println("try again later:", err)
		default:
			fmt.Println(claim.Decision, string(claim.Record.Result))
		}
	}
	topUp("cmd-0001", []byte(`{"account":"acc-1","amount":10}`))
	topUp("cmd-0001", []byte(`{"account":"acc-1","amount":10}`)) // redelivered
	topUp("cmd-0001", []byte(`{"account":"acc-1","amount":99}`)) // a producer reused the key

	var balance int64
	if err := pool.QueryRow(ctx, "SELECT balance FROM "+accounts+" WHERE id = 'acc-1'").Scan(&balance); err != nil {
		panic(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// new balance 10
	// duplicate balance 10
	// never applied, key reused: true
	// balance: 10
}

// Call a payment API at most once per command. The key is committed as
// PROCESSING under a lease before the call; a failed call releases it, so
// the next delivery takes it over at once; a completed key makes later
// deliveries duplicates, with the stored result.
func ExampleStore_DoLease() {
	ctx := context.Background()
	pool, schema, drop := pgtest.ExampleDB()
	defer drop()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	payload := []byte(`{"order":"ord-7","amount":250}`)
	key, err := dedupe.NewKey("payments", "pay-ord-7")
	if err != nil {
		panic(err)
	}
	req := dedupe.Request{Key: key, Fingerprint: dedupe.FingerprintOf(payload)}

	calls := 0
	charge := func(ctx context.Context) ([]byte, error) {
		calls++
		if calls == 1 {
			return nil, errors.New("gateway: 503") // nothing was charged
		}
		return []byte("charge ch_1"), nil
	}
	for range 3 { // three deliveries of one command
		claim, err := store.DoLease(ctx, req, 30*time.Second, charge)
		if err != nil {
			fmt.Println("failed, released for the next delivery:", err)
			continue
		}
		fmt.Println(claim.Decision, string(claim.Record.Result))
	}
	fmt.Println("calls:", calls)
	// Output:
	// failed, released for the next delivery: gateway: 503
	// takeover charge ch_1
	// duplicate charge ch_1
	// calls: 2
}

package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

// Apply many top-ups in one transaction, each exactly once, with one
// set-based UPDATE for the fresh ones. (Compile only: it needs a Postgres
// server.)
func ExampleStore_DoBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: "ledger"})
	if err != nil {
		panic(err)
	}
	type topup struct {
		ID, Account string
		Amount      int64
	}
	topups := []topup{{"cmd-1", "acc-1", 10}, {"cmd-2", "acc-2", 5}, {"cmd-1", "acc-1", 10}}
	reqs := make([]dedupe.Request, len(topups))
	for i, t := range topups {
		payload, _ := json.Marshal(t)
		reqs[i] = dedupe.Request{Key: dedupe.Key{Scope: "topups", ID: t.ID}, Fingerprint: dedupe.FingerprintOf(payload)}
	}
	answers, err := store.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
		accounts, amounts := make([]string, len(fresh)), make([]int64, len(fresh))
		for j, i := range fresh {
			accounts[j], amounts[j] = topups[i].Account, topups[i].Amount
		}
		_, err := tx.Exec(ctx, `UPDATE ledger.accounts AS a SET balance = a.balance + u.amount
			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::text[], $2::bigint[]) AS t(id, amount) GROUP BY id) AS u
			WHERE a.id = u.id`, accounts, amounts)
		return nil, err // nothing to store for duplicates
	})
	if err != nil {
		fmt.Println("nothing applied, try again later:", err)
		return
	}
	for i, a := range answers {
		if a.Err != nil {
			fmt.Println(reqs[i].Key, "not applied:", a.Err) // dead-letter it when dedupe.IsPermanent(a.Err)
			continue
		}
		fmt.Println(reqs[i].Key, a.Decision) // new, new, duplicate (the third repeats the first)
	}
}

package consumertest_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// The batch recipes of docs/batch.md ("One source row per target row"),
// word for word but for the table's name.
const (
	// naiveSQL has a source row per message: two payments to one account
	// update its row once.
	naiveSQL = `UPDATE accounts AS a SET balance = a.balance + u.amount
FROM unnest($1::text[], $2::bigint[]) AS u(id, amount)
WHERE a.id = u.id`
	// recipeSQL sums the payments per account first: one source row per
	// target row.
	recipeSQL = `UPDATE accounts AS a SET balance = a.balance + u.amount
FROM (SELECT id, sum(amount) AS amount
      FROM unnest($1::text[], $2::bigint[]) AS p(id, amount)
      GROUP BY id) AS u
WHERE a.id = u.id`
)

// payBatch is a batch handler of "account:amount" payments that runs sql
// with one array element per message.
func payBatch(sql, accounts string) consumer.BatchHandlerFunc {
	sql = strings.Replace(sql, "UPDATE accounts", "UPDATE "+accounts, 1)
	return func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		ids, amounts := make([]string, len(msgs)), make([]int64, len(msgs))
		for i, m := range msgs {
			id, amount, _ := strings.Cut(string(m.Payload), ":")
			n, err := strconv.ParseInt(amount, 10, 64)
			if err != nil {
				return nil, &consumer.MessageError{Index: i, Err: err}
			}
			ids[i], amounts[i] = id, n
		}
		_, err := tx.Exec(ctx, sql, ids, amounts)
		return nil, err
	}
}

// TestBatchRecipe: 20 payments of 100 to one account in one batch. The
// naive recipe (a source row per message) leaves the balance at 100, every
// key stored; the documented recipe (summed per account first) at 2000.
// consumertest.BatchParity tells the first from the second.
func TestBatchRecipe(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	accounts := db.Table("accounts")
	reset := func(ctx context.Context) error {
		_, err := db.Pool.Exec(ctx, "TRUNCATE "+accounts+"; INSERT INTO "+accounts+" VALUES ('a', 0), ('b', 0)")
		return err
	}
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+accounts+" (id text PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	state := func(ctx context.Context) (any, error) {
		rows, _ := db.Pool.Query(ctx, "SELECT id, balance FROM "+accounts+" ORDER BY id")
		return pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
			ID      string
			Balance int64
		}])
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	payments := func(run string) []*message.Message {
		var msgs []*message.Message
		for i := range 20 {
			msgs = append(msgs, message.NewMessage(fmt.Sprintf("%s-%d", run, i), []byte("a:100")))
		}
		return append(msgs, message.NewMessage(run+"-b", []byte("b:7")))
	}
	balance := func(id string) int64 {
		t.Helper()
		var b int64
		if err := db.Pool.QueryRow(ctx, "SELECT balance FROM "+accounts+" WHERE id = $1", id).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name, sql string
		want      int64
	}{{"naive", naiveSQL, 100}, {"recipe", recipeSQL, 2000}} {
		if err := reset(ctx); err != nil {
			t.Fatal(err)
		}
		h, err := consumertest.NewBatchHandler(store, payBatch(c.sql, accounts), &consumer.BatchConfig{Config: consumer.Config{Scope: c.name}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range h.Run(ctx, t, payments(c.name)...) {
			if !r.Acked || r.Record.Status != "COMPLETED" {
				t.Fatalf("%s: %s: acked %v, %s, key %s, %v", c.name, r.Key, r.Acked, r.Outcome, r.Record.Status, r.Err)
			}
		}
		if got := balance("a"); got != c.want {
			t.Errorf("%s: balance of a after 20 payments of 100 in one batch = %d, want %d", c.name, got, c.want)
		}
		if got := balance("b"); got != 7 {
			t.Errorf("%s: balance of b = %d, want 7", c.name, got)
		}
		err = consumertest.BatchParity(ctx, &consumertest.ParityConfig{Store: store, Handler: payBatch(c.sql, accounts),
			Config: &consumer.BatchConfig{Config: consumer.Config{Scope: c.name + "-parity"}}, Reset: reset, State: state},
			payments(c.name+"-parity")...)
		switch {
		case c.name == "naive" && err == nil:
			t.Errorf("naive: BatchParity found no difference")
		case c.name == "naive":
			t.Logf("naive: %v", err)
		case err != nil:
			t.Errorf("recipe: %v", err)
		}
	}
}

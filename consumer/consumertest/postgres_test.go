package consumertest_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// TestHandlerOnPostgres: a handler that writes SQL, run by the kit on a
// real pgstore.Store, is applied once, its duplicate gets the stored
// outputs, a reused key is refused, and a failure leaves neither its key
// nor its writes.
func TestHandlerOnPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	accounts := db.Table("accounts")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance bigint NOT NULL); "+
		"INSERT INTO "+accounts+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	fail := errors.New("refused after writing")
	h, err := consumertest.NewHandler(store, consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		amount, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "UPDATE "+accounts+" SET balance = balance + $1 WHERE id = 1", amount); err != nil {
			return nil, err
		}
		if msg.Metadata.Get("fail") != "" {
			return nil, fail
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
	}), &consumer.Config{Scope: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	balance := func() int64 {
		t.Helper()
		var b int64
		if err := db.Pool.QueryRow(ctx, "SELECT balance FROM "+accounts+" WHERE id = 1").Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}

	msg := message.NewMessage("p-1", []byte("5"))
	r := h.Run(ctx, t, msg)
	if r.Outcome != consumer.OutcomeApplied || r.Err != nil || balance() != 5 {
		t.Fatalf("first delivery: %s, %v, balance %d", r.Outcome, r.Err, balance())
	}
	if !r.Stored || r.Key != (dedupe.Key{Scope: "ledger", ID: "p-1"}) || len(r.StoredOutputs) != 1 || r.StoredOutputs[0].UUID != "out-p-1" {
		t.Fatalf("stored %v, key %v, outputs %v", r.Stored, r.Key, r.StoredOutputs)
	}

	r = h.Run(ctx, t, msg)
	if r.Outcome != consumer.OutcomeDuplicate || len(r.Outputs) != 1 || r.Outputs[0].UUID != "out-p-1" || balance() != 5 {
		t.Fatalf("duplicate: %s, %v, outputs %v, balance %d", r.Outcome, r.Err, r.Outputs, balance())
	}

	r = h.Run(ctx, t, message.NewMessage("p-1", []byte("7")))
	var reused *dedupe.KeyReusedError
	if r.Outcome != consumer.OutcomeKeyReused || !errors.As(r.Err, &reused) || balance() != 5 {
		t.Fatalf("reused key: %s, %v, balance %d", r.Outcome, r.Err, balance())
	}

	bad := message.NewMessage("p-2", []byte("100"))
	bad.Metadata.Set("fail", "yes")
	r = h.Run(ctx, t, bad)
	if r.Outcome != consumer.OutcomeFailed || !errors.Is(r.Err, fail) || r.Stored || balance() != 5 {
		t.Fatalf("failing handler: %s, %v, stored %v, balance %d", r.Outcome, r.Err, r.Stored, balance())
	}
}

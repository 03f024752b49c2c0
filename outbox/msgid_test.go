package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/outbox"
)

// A message written with no UUID gets a UUIDv7, in the row and in the
// message; a given UUID is kept.
func TestWriteTxMintsUUIDv7(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w, err := outbox.NewWriter(&outbox.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	minted, given := message.NewMessage("", []byte("a")), message.NewMessage("given", []byte("b"))
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, "t", minted, given) }); err != nil {
		t.Fatal(err)
	}
	if p, err := dedupe.ParseTimeID(minted.UUID); err != nil || p.Kind != dedupe.UUIDv7 {
		t.Fatalf("minted UUID %q: %v; want a UUIDv7", minted.UUID, err)
	}
	rows, err := db.Pool.Query(ctx, "SELECT uuid FROM "+pgx.Identifier{db.Schema, "exactly_outbox"}.Sanitize()+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != minted.UUID || got[1] != "given" {
		t.Fatalf("rows %q, want [%s given]", got, minted.UUID)
	}
}

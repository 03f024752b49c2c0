package pgstore_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// Two Stores of one schema share its names table. A name that one Store
// adds inside a caller's transaction is visible to the other Store in that
// same transaction; when the transaction rolls back, neither may keep the
// code: a key of that scope claimed later through either Store is one key.
func TestCodeAddedInRolledBackTxIsNotKeptByAnotherStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s1, _, db := newPartitioned(t, nil, "")
	if err := s1.Check(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	scope := "scope-" + uuid.NewString()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.ClaimTx(ctx, tx, dedupetest.Req(scope, uuid.Must(uuid.NewV7()).String(), "p")); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.ClaimTx(ctx, tx, dedupetest.Req(scope, uuid.Must(uuid.NewV7()).String(), "p")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	id := uuid.Must(uuid.NewV7()).String()
	runs := 0
	fn := func(context.Context, pgx.Tx) ([]byte, error) { runs++; return nil, nil }
	for _, s := range []*pgstore.Store{s1, s2} {
		if _, err := s.Do(ctx, dedupetest.Req(scope, id, "p"), fn); err != nil {
			t.Fatal(err)
		}
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_keys2")).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if runs != 1 || rows != 1 {
		t.Fatalf("key %s/%s through two Stores: fn ran %d times, %d key rows; want 1 and 1", scope, id, runs, rows)
	}
}

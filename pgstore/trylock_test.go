package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/advisory"
)

// TestTryLockKeyTx: a key's lock is one transaction's until it ends, other
// keys' are not held up, and its name is the one httpkey took the lock
// under itself, so that in a rolling upgrade a request on the old code and
// one on the new keep each other out.
func TestTryLockKeyTx(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, nil)
	ctx := context.Background()
	key := dedupe.Key{Scope: "http", ID: "4:acme/k1"}
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	try := func(tx pgx.Tx, k dedupe.Key) bool {
		t.Helper()
		ok, err := s.TryLockKeyTx(ctx, tx, k)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	first, second := begin(), begin()
	if !try(first, key) {
		t.Fatal("the first transaction did not get a free key's lock")
	}
	if !try(first, key) {
		t.Fatal("the holder did not get its own lock again")
	}
	if try(second, key) {
		t.Fatal("a second transaction got the lock the first holds")
	}
	if !try(second, dedupe.Key{Scope: "http", ID: "4:acme/k2"}) {
		t.Fatal("another key's lock was held up")
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	third := begin()
	if !try(third, key) {
		t.Fatal("the lock outlived the transaction that took it")
	}
	if err := third.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// The name httpkey computed before the store took the lock.
	old := begin()
	cfg := s.Config()
	var locked bool
	if err := old.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)",
		advisory.LockID("httpkey/"+cfg.Schema+"."+cfg.Table+"/"+key.Scope+"\x00"+key.ID)).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	if !locked {
		t.Fatal("the old code's lock was taken")
	}
	if try(begin(), key) {
		t.Fatal("the store's lock is not the one the old code took: old and new requests would run at once")
	}
}

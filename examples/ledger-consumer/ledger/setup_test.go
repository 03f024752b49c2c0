package ledger

import (
	"context"
	"sync"
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// Workers that start together each run Setup: none may fail on another's
// CREATE TABLE (pg_type's unique index), and the tables exist once.
func TestSetupConcurrently(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	for round := 0; round < 5; round++ {
		if round > 0 {
			if _, err := db.Pool.Exec(ctx, "DROP TABLE "+db.Table("accounts")+", "+db.Table("holds")+", "+db.Table("rejections")); err != nil {
				t.Fatal(err)
			}
		}
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = Setup(ctx, db.Pool, db.Schema) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Setup %d: %v", round, i, err)
			}
		}
		var tables int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", db.Schema).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 3 {
			t.Fatalf("round %d: %d tables, want 3", round, tables)
		}
	}
}

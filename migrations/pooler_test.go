package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
)

// Behind PgBouncer, which drops the startup search_path, Migrate refuses
// and names the fix, and no table lands anywhere. (Before, it returned
// nil having created every table in public, and the schema's version table
// said the schema was up to date.)
func TestMigrateBehindPooler(t *testing.T) {
	db := pgtest.NewEmpty(t)
	pooled := pgtest.PoolerPool(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec })
	ctx := context.Background()
	elsewhere := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname LIKE 'exactly%' AND c.relkind IN ('r', 'p') AND n.nspname IN ('public', 'postgres')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := elsewhere()
	err := migrations.Migrate(ctx, pooled, &migrations.Config{Schema: db.Schema})
	if got := elsewhere(); got != before {
		t.Errorf("%d of exactly's tables landed in public (or the user's schema), not in %s", got-before, db.Schema)
	}
	var tables int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	// Session mode cannot be told from transaction mode: refused in both.
	if err == nil || !strings.Contains(err.Error(), "direct connection") {
		t.Fatalf("Migrate through PgBouncer (%s mode) = %v, want a refusal that names the direct connection", pgtest.PoolerMode(), err)
	}
	if tables != 0 {
		t.Errorf("the refused migration left %d tables in the schema", tables)
	}
}

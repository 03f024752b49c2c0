package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/worker"
)

// A worker whose pool goes through a transaction pooler with pgx's default
// exec mode is refused at start, with the fix in the error: every
// statement failed for good there ("prepared statement … already exists",
// reported as "Postgres unavailable"), and the worker waited for ever.
func TestWorkerRefusesCacheStatementBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerURL(t)
	if pgtest.PoolerMode() != "transaction" {
		t.Skipf("the pooler runs in %s mode", pgtest.PoolerMode())
	}
	w := newWorld(t, 1)
	pool := pgtest.PoolerPool(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement })
	wk, err := worker.New(pool, w.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = wk.Run(ctx)
	if !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "default_query_exec_mode=exec") || ctx.Err() != nil {
		t.Fatalf("Run behind a transaction pooler with cache_statement: %v; want a refusal at once that names default_query_exec_mode=exec", err)
	}
}

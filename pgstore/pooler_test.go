package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// execModeForPooler is the exec mode a test behind the pooler runs with:
// the URL's, or exec when it names pgx's default, whose server-side
// statements outlive the client's transaction behind PgBouncer 1.18.
func execModeForPooler(cfg *pgxpool.Config) {
	if cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
}

// Behind a transaction pooler, Cleanup lets go of its lock: the next run,
// on another connection, is not "busy" and deletes, and no session holds
// the lock. (A session lock taken and released in separate statements ran
// on two server connections there: the release failed, and every other
// runner was busy for good.)
func TestCleanupBehindTransactionPooler(t *testing.T) {
	for _, layout := range []Layout{LayoutSingleTable, LayoutPartitioned} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) {
			db := pgtest.New(t)
			ctx := context.Background()
			direct, err := New(db.Pool, &Config{Schema: db.Schema, Layout: layout})
			if err != nil {
				t.Fatal(err)
			}
			if err := direct.Check(ctx); err != nil {
				t.Fatal(err)
			}
			// Busy neighbours: as soon as the lock is taken, another client
			// of the pooler starts a transaction, and so takes the server
			// connection that the lock's statement just ran on unless
			// Cleanup's own transaction still holds it.
			st := &stealer{t: t, other: pgtest.PoolerPool(t, execModeForPooler)}
			pooled, err := New(pgtest.PoolerPool(t, func(c *pgxpool.Config) {
				execModeForPooler(c)
				c.ConnConfig.Tracer = st
			}), &Config{Schema: db.Schema, Layout: layout})
			if err != nil {
				t.Fatal(err)
			}
			defer st.done()
			for i := range 3 {
				if _, err := pooled.Cleanup(ctx, nil); err != nil {
					t.Fatalf("Cleanup %d through the pooler: %v", i, err)
				}
			}
			var held int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND (classid::bigint << 32) | objid::bigint = $1`, direct.lockID).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Errorf("after Cleanup through the pooler, %d session(s) hold its lock", held)
			}
			if _, err := direct.Cleanup(ctx, nil); err != nil {
				t.Errorf("Cleanup on a direct connection after the pooler's: %v", err)
			}
		})
	}
}

// stealer starts a transaction on other, and keeps it open until done,
// each time a statement that takes an advisory lock has run.
type stealer struct {
	t     testing.TB
	other *pgxpool.Pool
	held  []pgx.Tx
}

func (s *stealer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "advisory") {
		return context.WithValue(ctx, stealerKey{}, true)
	}
	return ctx
}

func (s *stealer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(stealerKey{}) == nil {
		return
	}
	tx, err := s.other.Begin(context.Background())
	if err != nil {
		s.t.Errorf("steal: %v", err)
		return
	}
	if _, err := tx.Exec(context.Background(), "SELECT 1"); err != nil {
		s.t.Errorf("steal: %v", err)
	}
	s.held = append(s.held, tx)
}

func (s *stealer) done() {
	for _, tx := range s.held {
		_ = tx.Rollback(context.Background())
	}
}

type stealerKey struct{}

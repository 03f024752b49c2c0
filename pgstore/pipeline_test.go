package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// TestBeginLockClaimTx runs httpkey's pipelined transaction
// (BeginLockClaimTx, then CompleteCommitTx) on both layouts in every exec
// mode, on a pool of 2: a key whose lock another transaction holds is not
// claimed and its transaction leaves nothing behind; a claimed key holds
// the lock until its transaction ends, and commits with its result and the
// transaction's writes; a second claim is a duplicate with the result; a
// result whose key was not claimed in the transaction fails and commits
// nothing.
func TestBeginLockClaimTx(t *testing.T) {
	exercisePipelined(t, execModes, func(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
		cfg, err := pgtest.Config(pgtest.RequireURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 2
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	})
}

// TestBeginLockClaimTxBehindTransactionPooler is TestBeginLockClaimTx
// through the pooler, in the modes that work there.
func TestBeginLockClaimTxBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerURL(t)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	exercisePipelined(t, modes, func(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
		return pgtest.PoolerPool(t, func(c *pgxpool.Config) { c.MaxConns = 2; c.ConnConfig.DefaultQueryExecMode = mode })
	})
}

func exercisePipelined(t *testing.T, modes []pgx.QueryExecMode, newPool func(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool) {
	for _, mode := range modes {
		for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
			t.Run(fmt.Sprint(mode, "/", layout), func(t *testing.T) {
				t.Parallel()
				db := pgtest.New(t)
				ctx := context.Background()
				s, err := pgstore.New(newPool(t, mode), &pgstore.Config{Schema: db.Schema, Layout: layout})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Check(ctx); err != nil {
					t.Fatal(err)
				}
				writes := db.Table("writes")
				if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+writes+" (id text PRIMARY KEY)"); err != nil {
					t.Fatal(err)
				}
				write := func(tx pgx.Tx, id string) {
					t.Helper()
					if _, err := tx.Exec(ctx, "INSERT INTO "+writes+" (id) VALUES ($1)", id); err != nil {
						t.Fatal(err)
					}
				}
				written := func(id string) bool {
					t.Helper()
					var n int
					if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+writes+" WHERE id = $1", id).Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n == 1
				}
				for _, id := range []string{uuid.Must(uuid.NewV7()).String(), uuid.NewString(), "order-17"} {
					req := dedupetest.Req("http", id, "p")

					// Another transaction holds the key's lock.
					holder, err := s.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if ok, err := s.TryLockKeyTx(ctx, holder, req.Key); err != nil || !ok {
						t.Fatalf("%s: TryLockKeyTx = %v, %v", id, ok, err)
					}
					tx, locked, c, err := s.BeginLockClaimTx(ctx, req)
					if err != nil || locked || tx != nil {
						t.Fatalf("%s: BeginLockClaimTx under a held lock = %v, %v, %v, want no transaction, not locked", id, tx, locked, err)
					}
					if _, err := s.Get(ctx, req.Key); !errors.Is(err, dedupe.ErrNotFound) {
						t.Fatalf("%s: the key was claimed under a held lock: Get = %v", id, err)
					}
					if err := holder.Rollback(ctx); err != nil {
						t.Fatal(err)
					}

					// The key is free: claimed, locked until the commit.
					tx, locked, c, err = s.BeginLockClaimTx(ctx, req)
					if err != nil || !locked || c.Decision != dedupe.DecisionNew {
						t.Fatalf("%s: BeginLockClaimTx = %v, %v, %v, want new", id, locked, c.Decision, err)
					}
					write(tx, id)
					other, err := s.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if ok, err := s.TryLockKeyTx(ctx, other, req.Key); err != nil || ok {
						t.Fatalf("%s: another transaction took the lock of a claimed key: %v, %v", id, ok, err)
					}
					if err := other.Rollback(ctx); err != nil {
						t.Fatal(err)
					}
					if err := s.CompleteCommitTx(ctx, tx, c, []byte("r-"+id)); err != nil {
						t.Fatalf("%s: CompleteCommitTx: %v", id, err)
					}
					if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
						t.Fatalf("%s: the transaction is still open after CompleteCommitTx: Commit = %v", id, err)
					}
					r, err := s.Get(ctx, req.Key)
					if err != nil || string(r.Result) != "r-"+id || r.Status != dedupe.StatusCompleted || !written(id) {
						t.Fatalf("%s: after the commit: %q %v, %v, written %v", id, r.Result, r.Status, err, written(id))
					}

					// A duplicate gets the result.
					tx, locked, c, err = s.BeginLockClaimTx(ctx, req)
					if err != nil || !locked || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "r-"+id {
						t.Fatalf("%s: second BeginLockClaimTx = %v, %v %q, %v, want a duplicate", id, locked, c.Decision, c.Record.Result, err)
					}
					if err := tx.Rollback(ctx); err != nil {
						t.Fatal(err)
					}

					// A result for a key not claimed in the transaction: no commit.
					fresh := dedupetest.Req("http", id+"-fresh", "p")
					tx, _, c, err = s.BeginLockClaimTx(ctx, fresh)
					if err != nil || c.Decision != dedupe.DecisionNew {
						t.Fatalf("%s: BeginLockClaimTx = %v, %v", id, c.Decision, err)
					}
					write(tx, id+"-fresh")
					c.Record.Key = dedupe.Key{Scope: "http", ID: id + "-never"}
					if err := s.CompleteCommitTx(ctx, tx, c, []byte("r")); err == nil {
						t.Fatalf("%s: CompleteCommitTx of a key not claimed in the transaction succeeded", id)
					}
					if err := tx.Rollback(ctx); err != nil {
						t.Fatalf("%s: Rollback after the failed CompleteCommitTx: %v", id, err)
					}
					if written(id + "-fresh") {
						t.Fatalf("%s: the transaction committed although its result found no key", id)
					}
					if _, err := s.Get(ctx, fresh.Key); !errors.Is(err, dedupe.ErrNotFound) {
						t.Fatalf("%s: the key committed although its result found no row: Get = %v", id, err)
					}
				}
			})
		}
	}
}

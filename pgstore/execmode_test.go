package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// execModes are every QueryExecMode pgx offers.
var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// exerciseModes runs claims, duplicates, batches, reads and the clean-up
// of both layouts on pools from newPool, one per exec mode, with IDs of
// every kind (UUIDv7, UUIDv4, text).
func exerciseModes(t *testing.T, modes []pgx.QueryExecMode, newPool func(t *testing.T, db *pgtest.DB, mode pgx.QueryExecMode) *pgxpool.Pool) {
	for _, mode := range modes {
		for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
			t.Run(fmt.Sprint(mode, "/", layout), func(t *testing.T) {
				t.Parallel()
				db := pgtest.New(t)
				ctx := context.Background()
				s, err := pgstore.New(newPool(t, db, mode), &pgstore.Config{Schema: db.Schema, Layout: layout})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Check(ctx); err != nil {
					t.Fatalf("Check: %v", err)
				}
				ids := []string{uuid.Must(uuid.NewV7()).String(), uuid.NewString(), "order-17"}
				for round, want := range []dedupe.Decision{dedupe.DecisionNew, dedupe.DecisionDuplicate} {
					for _, id := range ids {
						c, err := s.Do(ctx, dedupetest.Req("s", id, "p"), func(context.Context, pgx.Tx) ([]byte, error) { return []byte("r-" + id), nil })
						if err != nil {
							t.Fatalf("round %d: Do %s: %v", round, id, err)
						}
						if c.Decision != want {
							t.Fatalf("round %d: Do %s: %v, want %v", round, id, c.Decision, want)
						}
					}
				}
				var reqs []dedupe.Request
				for _, id := range append([]string{uuid.Must(uuid.NewV7()).String(), uuid.NewString(), "order-18"}, ids...) {
					reqs = append(reqs, dedupetest.Req("b", id, "p"))
				}
				claims, err := s.DoBatch(ctx, reqs, func(_ context.Context, _ pgx.Tx, fresh []int) ([][]byte, error) {
					out := make([][]byte, len(fresh))
					for i := range out {
						out[i] = []byte("batch")
					}
					return out, nil
				})
				if err != nil {
					t.Fatalf("DoBatch: %v", err)
				}
				if len(claims) != len(reqs) {
					t.Fatalf("DoBatch: %d claims for %d requests", len(claims), len(reqs))
				}
				for _, id := range ids {
					r, err := s.Get(ctx, dedupe.Key{Scope: "s", ID: id})
					if err != nil || string(r.Result) != "r-"+id {
						t.Fatalf("Get %s: %q, %v", id, r.Result, err)
					}
				}
				if _, err := s.Cleanup(ctx, nil); err != nil {
					t.Fatalf("Cleanup: %v", err)
				}
			})
		}
	}
}

// Every exec mode works on a direct connection: with exec and
// simple_protocol pgx takes a parameter's type from its Go type, and a
// UUID's key was a [16]byte, which it cannot encode.
func TestExecModes(t *testing.T) {
	exerciseModes(t, execModes, func(t *testing.T, db *pgtest.DB, mode pgx.QueryExecMode) *pgxpool.Pool {
		cfg, err := pgtest.Config(pgtest.RequireURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	})
}

// The modes that keep no statement on the server between round trips work
// behind a transaction pooler (the others are refused:
// TestCheckRefusesStatefulModesBehindTransactionPooler).
func TestExecModesBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerURL(t)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	exerciseModes(t, modes, func(t *testing.T, db *pgtest.DB, mode pgx.QueryExecMode) *pgxpool.Pool {
		return pgtest.PoolerPool(t, func(c *pgxpool.Config) { c.MaxConns = 4; c.ConnConfig.DefaultQueryExecMode = mode })
	})
}

// Behind a transaction pooler, Check refuses the modes that keep a
// statement on the server between round trips, naming the fix; before,
// every claim failed ("prepared statement ... already exists", reported as
// Postgres unavailable).
func TestCheckRefusesStatefulModesBehindTransactionPooler(t *testing.T) {
	pgtest.PoolerURL(t)
	if pgtest.PoolerMode() != "transaction" {
		t.Skipf("the pooler runs in %s mode", pgtest.PoolerMode())
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			db := pgtest.New(t)
			pool := pgtest.PoolerPool(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			s, err := pgstore.New(pool, &pgstore.Config{Schema: db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Check(context.Background())
			if !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
				t.Fatalf("Check = %v, want a configuration error that names default_query_exec_mode=exec", err)
			}
		})
	}
}

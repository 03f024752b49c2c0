package pgstore

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// Every entry point of a Store completes on a pool that has one free
// connection (MaxConns 1, or 2 with one held elsewhere, as an outbox
// relay's LISTEN holds one), on both layouts, with the partitioned
// layout's state stale and scope and topic names never seen before: no
// path holds one connection of the pool while it waits for another. Each
// step runs under a deadline far beyond its work, which a step that waits
// for a second connection reaches.
func TestSmallPoolEveryEntryPoint(t *testing.T) {
	t.Parallel()
	for _, layout := range []Layout{LayoutSingleTable, LayoutPartitioned} {
		for _, conns := range []int32{1, 2} {
			t.Run(layout.String()+"/"+string(rune('0'+conns)), func(t *testing.T) {
				t.Parallel()
				db := pgtest.New(t)
				cfg, err := pgxpool.ParseConfig(db.Pool.Config().ConnString())
				if err != nil {
					t.Fatal(err)
				}
				cfg.ConnConfig = db.Pool.Config().ConnConfig.Copy()
				cfg.MaxConns = conns
				pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				if conns == 2 {
					held, err := pool.Acquire(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					defer held.Release()
				}
				s, err := New(pool, &Config{Schema: db.Schema, Layout: layout, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				stale := func() {
					if s.part() != nil {
						s.part().forget()
					}
				}
				n := 0
				req := func() dedupe.Request {
					n++
					r := dedupetest.Req("scope-"+uuid.NewString(), uuid.Must(uuid.NewV7()).String(), "p")
					r.Source = dedupe.Source{Topic: "topic-" + uuid.NewString(), Partition: 0, Offset: int64(n)}
					return r
				}
				step := func(name string, f func(ctx context.Context) error) {
					t.Helper()
					stale()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					if err := f(ctx); err != nil {
						t.Fatalf("%s on a pool of %d with one free connection: %v", name, conns, err)
					}
				}
				step("Check", func(ctx context.Context) error { return s.Check(ctx) })
				step("Do", func(ctx context.Context) error {
					_, err := s.Do(ctx, req(), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						stale() // the state goes stale while the transaction runs
						return []byte("r"), nil
					})
					return err
				})
				step("DoBatch", func(ctx context.Context) error {
					reqs := []dedupe.Request{req(), req(), req()}
					_, err := s.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
						stale()
						return [][]byte{[]byte("a"), []byte("b"), []byte("c")}, nil
					})
					return err
				})
				inTx := func(f func(ctx context.Context, tx pgx.Tx) error) func(ctx context.Context) error {
					return func(ctx context.Context) error {
						tx, err := s.Begin(ctx)
						if err != nil {
							return err
						}
						defer func() { _ = tx.Rollback(context.Background()) }()
						if err := f(ctx, tx); err != nil {
							return err
						}
						return tx.Commit(ctx)
					}
				}
				step("ClaimTx", inTx(func(ctx context.Context, tx pgx.Tx) error {
					c, err := s.ClaimTx(ctx, tx, req())
					if err != nil {
						return err
					}
					stale()
					return s.CompleteTx(ctx, tx, c, []byte("r"))
				}))
				step("ClaimBatchTx", inTx(func(ctx context.Context, tx pgx.Tx) error {
					out, err := s.ClaimBatchTx(ctx, tx, []dedupe.Request{req(), req()})
					if err != nil {
						return err
					}
					stale()
					return s.CompleteBatchTx(ctx, tx, out, []int{0, 1}, [][]byte{[]byte("a"), []byte("b")})
				}))
				var leased dedupe.Claim
				step("Acquire", func(ctx context.Context) error {
					var err error
					leased, err = s.Acquire(ctx, req(), time.Minute)
					return err
				})
				step("Complete", func(ctx context.Context) error { return s.Complete(ctx, leased, []byte("r")) })
				step("Get", func(ctx context.Context) error { _, err := s.Get(ctx, leased.Record.Key); return err })
				step("GetTx", inTx(func(ctx context.Context, tx pgx.Tx) error { _, err := s.GetTx(ctx, tx, leased.Record.Key); return err }))
				step("Stats", func(ctx context.Context) error { _, err := s.Stats(ctx); return err })
				step("Cleanup", func(ctx context.Context) error { _, err := s.Cleanup(ctx, nil); return err })
				step("CheckMaintenance", func(ctx context.Context) error { return s.CheckMaintenance(ctx) })
				var keys int
				if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+s.table).Scan(&keys); err != nil || keys != 8 {
					t.Fatalf("%d keys stored (%v); want the 8 claimed", keys, err)
				}
			})
		}
	}
}

// A scope name first met by ClaimTx is added in the caller's transaction:
// when that transaction rolls back, the name's code goes with it and is
// not kept by the store; a later transaction adds it again, and the
// store caches the code once it sees it committed.
func TestCodeAddedInARolledBackTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: LayoutPartitioned, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	r := dedupetest.Req("fresh-scope", uuid.Must(uuid.NewV7()).String(), "p")
	claim := func(commit bool) {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := s.ClaimTx(ctx, tx, r); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	claim(false)
	if _, ok := s.part().codes.Load("fresh-scope"); ok {
		t.Fatal("the code of a name added by a transaction that rolled back is cached")
	}
	claim(true)
	c, err := s.Do(ctx, r, noopTx)
	if err != nil || c.Decision != dedupe.DecisionDuplicate {
		t.Fatalf("after the committed claim: %v %v", c.Decision, err)
	}
	var code int16
	if err := db.Pool.QueryRow(ctx, "SELECT code FROM "+db.Table("exactly_key_names")+" WHERE name = 'fresh-scope'").Scan(&code); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.part().codes.Load("fresh-scope"); !ok || got.(int16) != code {
		t.Fatalf("cached code %v, %v; want the committed %d", got, ok, code)
	}
}

func noopTx(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }

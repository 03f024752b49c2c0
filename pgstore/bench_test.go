package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// benchSetup makes a store and an accounts table, the one-UPDATE handler,
// and the plain transaction that runs it without deduplication.
func benchSetup(b *testing.B) (*pgstore.Store, pgstore.TxFunc, func(context.Context) error) {
	s, db := newStore(b, nil)
	accounts := db.Table("accounts")
	if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance bigint NOT NULL);"+
		"INSERT INTO "+accounts+" SELECT g, 0 FROM generate_series(0, 999) g"); err != nil {
		b.Fatal(err)
	}
	update := "UPDATE " + accounts + " SET balance = balance + 1 WHERE id = $1"
	handler := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, update, rand.IntN(1000))
		return nil, err
	}
	plain := func(ctx context.Context) error {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := handler(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	return s, handler, plain
}

// BenchmarkMessageTx compares one message's transaction with a one-UPDATE
// handler: plain (no deduplication), with the claim (a new key each time),
// and the duplicate path (the handler does not run). Compare ns/op side by
// side from one run:
//
//	go test -run '^$' -bench MessageTx -count 5 ./pgstore
func BenchmarkMessageTx(b *testing.B) {
	s, handler, plain := benchSetup(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.Run("plain", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := plain(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("dedupe", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req := dedupetest.Req("bench", fmt.Sprint("new-", seq.Add(1)), `{"amount":1}`)
				if c, err := s.Do(ctx, req, handler); err != nil || c.Decision != dedupe.DecisionNew {
					b.Fatal(c.Decision, err)
				}
			}
		})
	})
	dup := dedupetest.Req("bench", "dup", `{"amount":1}`)
	if _, err := s.Do(ctx, dup, handler); err != nil {
		b.Fatal(err)
	}
	b.Run("duplicate", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if c, err := s.Do(ctx, dup, handler); err != nil || c.Decision != dedupe.DecisionDuplicate {
					b.Fatal(c.Decision, err)
				}
			}
		})
	})
}

// BenchmarkMessageTxRatio interleaves the plain transaction and Do with a new
// key in the same loop, so both see the same machine load, and reports the
// throughput ratio dedupe/plain (the goal is at least 0.80):
//
//	go test -run '^$' -bench MessageTxRatio -count 5 -benchtime 4000x ./pgstore
func BenchmarkMessageTxRatio(b *testing.B) {
	s, handler, plain := benchSetup(b)
	ctx := context.Background()
	var seq atomic.Int64
	var plainNs, dedupeNs atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			start := time.Now()
			if err := plain(ctx); err != nil {
				b.Fatal(err)
			}
			mid := time.Now()
			req := dedupetest.Req("bench", fmt.Sprint("ratio-", seq.Add(1)), `{"amount":1}`)
			if c, err := s.Do(ctx, req, handler); err != nil || c.Decision != dedupe.DecisionNew {
				b.Fatal(c.Decision, err)
			}
			plainNs.Add(int64(mid.Sub(start)))
			dedupeNs.Add(int64(time.Since(mid)))
		}
	})
	b.ReportMetric(float64(plainNs.Load())/float64(dedupeNs.Load()), "dedupe/plain")
	b.ReportMetric(float64(plainNs.Load())/float64(b.N), "plain-ns/op")
	b.ReportMetric(float64(dedupeNs.Load())/float64(b.N), "dedupe-ns/op")
}

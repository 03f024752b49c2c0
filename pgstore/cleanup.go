package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/pooler"
)

// Cleanup implements dedupe.Store. Each batch is its own statement and
// skips rows that a claim holds, so it never makes a claim wait. An
// advisory lock keeps it to one runner per table. On a direct connection
// it is a session lock, taken and let go on the connection that does the
// work; a failed release closes that connection, which lets go of it on
// the server. Behind a connection pooler, which may give two statements of
// one connection two server sessions (transaction mode), it is a
// transaction-scoped lock held by a transaction
// of its own on a second connection of the pool for as long as Cleanup
// runs: it ends with that transaction whatever happens. There Cleanup
// needs two of the pool's connections; with only one to be had within a
// second it returns a retryable error, and on a pool whose MaxConns is 1
// an error that names the fix.
func (s *Store) Cleanup(ctx context.Context, cfg *dedupe.CleanupConfig) (int64, error) {
	batch, maxBatches := 1000, 0
	if cfg != nil {
		if cfg.BatchSize < 0 || cfg.MaxBatches < 0 {
			return 0, fmt.Errorf("pgstore: cleanup: BatchSize %d and MaxBatches %d must not be negative", cfg.BatchSize, cfg.MaxBatches)
		}
		if cfg.BatchSize > 0 {
			batch = cfg.BatchSize
		}
		maxBatches = cfg.MaxBatches
	}
	info, err := s.poolerInfo(ctx)
	if err != nil {
		return 0, classify("cleanup", err)
	}
	if !info.Transaction {
		return s.cleanupSession(ctx, batch, maxBatches)
	}
	return s.cleanupPooled(ctx, batch, maxBatches)
}

// cleanupPooled is Cleanup behind a connection pooler: under a
// transaction-scoped lock held on a connection of its own.
func (s *Store) cleanupPooled(ctx context.Context, batch, maxBatches int) (total int64, err error) {
	if m := s.pool.Config().MaxConns; m < 2 {
		return 0, fmt.Errorf("pgstore: cleanup %s: the pool's connections go through a connection pooler and its MaxConns is %d: Cleanup holds its lock in a transaction on one connection while it works on another there: give the pool 2 connections or more (pool_max_conns) (%w)", s.table, m, dedupe.ErrMisconfigured)
	}
	lock, err := s.lockCleanup(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// A failed rollback closes the connection (pgx), which ends the
		// transaction and its lock on the server: it is reported, never
		// left held.
		if rerr := lock.tx.Rollback(uctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("pgstore: cleanup %s: unlock (its connection was closed, which lets go of it): %w", s.table, rerr))
		}
		lock.conn.Release()
	}()
	// The work's connection: waiting for it while holding the lock's is
	// bounded, so that a busy pool makes this run fail rather than wait on
	// its neighbours.
	actx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := s.pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: no second connection of the pool within 1s (the pool is busy; the next run tries again)", err)
		}
		return 0, dedupe.Retryable(fmt.Errorf("pgstore: cleanup %s: %w", s.table, err))
	}
	defer conn.Release()
	return s.cleanupOn(ctx, conn, batch, maxBatches)
}

// cleanupSession is Cleanup under a session advisory lock on the
// connection that does the work.
func (s *Store) cleanupSession(ctx context.Context, batch, maxBatches int) (total int64, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, classify("cleanup", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.lockID).Scan(&locked); err != nil {
		return 0, classify("cleanup", err)
	}
	if !locked {
		return 0, fmt.Errorf("pgstore: cleanup %s: %w", s.table, dedupe.ErrCleanupBusy)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var released bool
		uerr := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", s.lockID).Scan(&released)
		if uerr == nil && !released {
			uerr = errors.New("the session did not hold it: its statements ran on another server session (a pooler in transaction mode?)")
		}
		if uerr != nil {
			// Never hand a connection that may still hold the lock back to
			// the pool: closing it ends the session on a direct connection.
			_ = conn.Conn().Close(uctx)
			err = errors.Join(err, fmt.Errorf("pgstore: cleanup %s: unlock: %w", s.table, uerr))
		}
	}()
	return s.cleanupOn(ctx, conn, batch, maxBatches)
}

// cleanupOn runs the layout's maintenance, then deletes expired keys in
// batches, on conn (the cleanup lock held).
func (s *Store) cleanupOn(ctx context.Context, conn *pgxpool.Conn, batch, maxBatches int) (int64, error) {
	total, cleanup, err := s.l.cleanup(ctx, conn)
	if err != nil {
		return total, err
	}
	for n := 0; maxBatches == 0 || n < maxBatches; n++ {
		tag, err := conn.Exec(ctx, cleanup, batch)
		if err != nil {
			return total, classify("cleanup", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	return total, nil
}

// poolerInfo is what pooler.Detect found on the store's pool, asked once.
func (s *Store) poolerInfo(ctx context.Context) (pooler.Info, error) {
	s.pooler.mu.Lock()
	defer s.pooler.mu.Unlock()
	if s.pooler.known {
		return s.pooler.info, nil
	}
	info, err := pooler.Detect(ctx, s.pool)
	if err != nil {
		return info, err
	}
	s.pooler.info, s.pooler.known = info, true
	return info, nil
}

// cleanupLock is the transaction that holds a table's cleanup lock, on a
// connection of the pool.
type cleanupLock struct {
	tx   pgx.Tx
	conn *pgxpool.Conn
}

// lockCleanup takes the table's cleanup lock in a transaction of its own,
// or returns dedupe.ErrCleanupBusy when another runner holds it.
func (s *Store) lockCleanup(ctx context.Context) (*cleanupLock, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, classify("cleanup", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		conn.Release()
		return nil, classify("cleanup", err)
	}
	var locked bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.lockID).Scan(&locked); err != nil || !locked {
		pgtx.Rollback(ctx, tx)
		conn.Release()
		if err != nil {
			return nil, classify("cleanup", err)
		}
		return nil, fmt.Errorf("pgstore: cleanup %s: %w", s.table, dedupe.ErrCleanupBusy)
	}
	return &cleanupLock{tx: tx, conn: conn}, nil
}

// RunCleanup calls Cleanup every interval until ctx is done, logging what it
// deleted; another runner holding the lock is not an error. It returns nil
// when ctx is cancelled.
func (s *Store) RunCleanup(ctx context.Context, every time.Duration, cfg *dedupe.CleanupConfig) error {
	if every <= 0 {
		return fmt.Errorf("pgstore: RunCleanup: interval is %v: set a positive duration", every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := s.Cleanup(ctx, cfg)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, dedupe.ErrCleanupBusy):
		case err != nil:
			s.cfg.Logger.WarnContext(ctx, "pgstore: cleanup failed", "table", s.table, "err", err)
		case n > 0:
			s.cfg.Logger.InfoContext(ctx, "pgstore: expired keys deleted", "table", s.table, "deleted", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

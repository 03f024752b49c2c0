package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/sqlident"
)

// Stats describes the outbox, for metrics.
type Stats struct {
	Pending int64
	Dead    int64
	// Lag is the age of the oldest pending message; 0 when none.
	Lag time.Duration
}

// Stats reads the outbox's counts and lag.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest *time.Time
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	if err := r.pool.QueryRow(ctx, r.q.stats).Scan(&st.Pending, &st.Dead, &oldest); err != nil {
		return st, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil {
		st.Lag = time.Since(*oldest)
	}
	return st, nil
}

// Backlog reads the outbox that a Writer writes to, from a process that
// writes to it without running a Relay (an HTTP API beside the workers):
// its Stats serve [github.com/exactly-go/exactly/plugin/eprom]'s
// WatchOutbox (the exactly_outbox_oldest_pending_seconds gauge), and an
// oldest pending message that keeps ageing says that no relay publishes
// the outbox.
type Backlog struct {
	pool  *pgxpool.Pool
	stats string
}

// Backlog returns the Backlog of w's outbox on pool (Config.Schema, else
// the schema of pool's search_path).
func (w *Writer) Backlog(pool *pgxpool.Pool) (*Backlog, error) {
	schema := w.cfg.Schema
	if w.follow {
		schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
		if err := sqlident.Check("outbox: the schema of the pool's search_path (Config.Schema is empty)", schema); err != nil {
			return nil, err
		}
	}
	return &Backlog{pool: pool, stats: newQueries(pgx.Identifier{schema, w.cfg.Table}.Sanitize(), "").stats}, nil
}

// Stats reads the outbox's counts and lag, as [Relay.Stats] does.
func (b *Backlog) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest *time.Time
	if err := b.pool.QueryRow(ctx, b.stats).Scan(&st.Pending, &st.Dead, &oldest); err != nil {
		return st, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil {
		st.Lag = time.Since(*oldest)
	}
	return st, nil
}

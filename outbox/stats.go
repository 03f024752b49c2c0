package outbox

import (
	"context"
	"fmt"
	"time"
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

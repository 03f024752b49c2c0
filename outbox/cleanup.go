package outbox

import (
	"context"
	"fmt"
)

// Cleanup deletes PUBLISHED rows older than PublishedRetention, in batches,
// and returns how many it deleted. Pending and DEAD rows are never deleted.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, r.q.cleanup, float64(r.cfg.PublishedRetention.Microseconds()))
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

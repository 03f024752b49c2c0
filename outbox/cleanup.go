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
		ectx, cancel := r.bounded(ctx)
		tag, err := r.pool.Exec(ectx, r.q.cleanup, float64(r.cfg.PublishedRetention.Microseconds()))
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

package pgstore

import (
	"context"

	"github.com/exactly-go/exactly/dedupe"
)

// statsExactMax is the most keys that Stats counts exactly; past it, the
// counts are estimates from the table's statistics, so a call costs the
// same with a billion keys as with a hundred thousand.
const statsExactMax = 50_000

// Stats implements dedupe.Store in constant time: up to 50,000 keys it
// counts them; past that, it estimates the counts from the table's
// statistics (Stats.Estimated), which autovacuum keeps within a few
// percent, and reads no more than a bounded number of rows.
func (s *Store) Stats(ctx context.Context) (dedupe.Stats, error) { return s.l.stats(ctx, s.pool) }

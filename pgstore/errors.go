package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/dedupe"
)

// Retryable SQLSTATEs: the same transaction may succeed if run again.
var retryableCodes = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available
	"57P01": true, // admin_shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now
}

// IsRetryableError reports whether err, as returned by pgx, is transient: a
// serialisation failure (40001, what REPEATABLE READ and SERIALIZABLE
// transactions get when a concurrent claim of the same key commits first), a
// deadlock (40P01), a server going down, or a connection lost before the
// server could have acted.
func IsRetryableError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return retryableCodes[pgErr.Code] || pgErr.Code[:2] == "08"
	}
	return pgconn.SafeToRetry(err)
}

// classify wraps a pgx error at the storage boundary, marking transient ones
// with dedupe.Retryable.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	wrapped := fmt.Errorf("pgstore: %s: %w", op, err)
	if IsRetryableError(err) {
		return dedupe.Retryable(wrapped)
	}
	return wrapped
}

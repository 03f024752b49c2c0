package pgstore

import (
	"fmt"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
)

// IsRetryableError reports whether err, as returned by pgx, is transient: a
// serialisation failure (40001, what REPEATABLE READ and SERIALIZABLE
// transactions get when a concurrent claim of the same key commits first), a
// deadlock (40P01), a server going down, or a connection lost before the
// server could have acted.
func IsRetryableError(err error) bool { return pgerr.IsRetryable(err) }

// IsConfigurationError reports whether err, as returned by pgx, says that
// the deployment is wrong rather than the data or the connection: a table,
// column, schema or function that does not exist or is not allowed (SQLSTATE
// class 42, e.g. 42P01 when the migrations did not run or a table name is
// not schema-qualified), a schema or database that does not exist (3F, 3D),
// or failed authentication (28), or a store with LayoutSingleTable claiming
// where the partitioned layout has started (EXK01, ErrSingleTableClosed). Running the same statement again cannot
// succeed until someone fixes the deployment, and the message is not at
// fault either: such errors are neither retried nor dead-lettered.
func IsConfigurationError(err error) bool { return pgerr.IsConfiguration(err) }

// ErrSingleTableClosed is the error of a store with LayoutSingleTable that
// claims a new key on a schema where the partitioned layout has started (a
// store with LayoutPartitioned ran there): a key it claimed could have
// been claimed by the partitioned layout too, and run twice. It wraps
// dedupe.ErrMisconfigured: the message is held, not dead-lettered, until
// its worker runs with LayoutPartitioned.
var ErrSingleTableClosed = fmt.Errorf("%w: the partitioned key layout has started on this schema, so a store with "+
	"LayoutSingleTable may not claim new keys there: run every worker of the schema with pgstore.LayoutPartitioned "+
	"(worker.Config.KeyLayout, its default); the keys in exactly_keys are still honoured", dedupe.ErrMisconfigured)

// ErrLegacyClosed is ErrSingleTableClosed.
//
// Deprecated: use ErrSingleTableClosed.
var ErrLegacyClosed = ErrSingleTableClosed

// classify wraps a pgx error at the storage boundary, marking transient ones
// with dedupe.Retryable and configuration errors with dedupe.ErrMisconfigured
// and the fix.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if pgerr.IsSingleTableClosed(err) {
		return fmt.Errorf("pgstore: %s: %w (%w)", op, ErrSingleTableClosed, err)
	}
	if IsConfigurationError(err) {
		return fmt.Errorf("pgstore: %s: %w (%w: run migrations.Migrate on this database, "+
			"or set pgstore.Config.Schema and Config.Table to the migrated table)", op, err, dedupe.ErrMisconfigured)
	}
	wrapped := fmt.Errorf("pgstore: %s: %w", op, err)
	if IsRetryableError(err) {
		return dedupe.Retryable(wrapped)
	}
	return wrapped
}

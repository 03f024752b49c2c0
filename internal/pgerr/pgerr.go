// Package pgerr classifies the errors of pgx for the packages that run
// statements (pgstore) and those that run handlers' statements (consumer):
// transient, a fault of the deployment, or the server's answer.
package pgerr

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// retryableCodes are the SQLSTATEs of a transaction that may succeed if run
// again.
var retryableCodes = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available
	"57P01": true, // admin_shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now
}

// SingleTableClosedCode is the SQLSTATE that exactly_keys's insert guard raises
// once the partitioned key layout started on the schema (migration 00008).
const SingleTableClosedCode = "EXK01"

// IsRetryable reports whether err is transient: a serialisation failure, a
// deadlock, a lock not available, a server going down, a connection class
// error, or a connection lost before the server could have acted. A
// cancelled or expired context is not.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return retryableCodes[pgErr.Code] || class(pgErr) == "08"
	}
	return pgconn.SafeToRetry(err)
}

// IsConfiguration reports whether err says the deployment is wrong rather
// than the data or the connection: SQLSTATE class 42 (a table, column,
// schema or function missing or not allowed), 3F, 3D (no such schema or
// database), 28 (authentication), or SingleTableClosedCode.
func IsConfiguration(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch class(pgErr) {
	case "42", "3F", "3D", "28":
		return true
	}
	return pgErr.Code == SingleTableClosedCode
}

// SingleTableRetiredCode is the SQLSTATE that exactly_keys's update guard
// raises once the clean-up retired the table (migration 00009): no store
// reads it any more, and every key in it had expired.
const SingleTableRetiredCode = "EXK02"

// IsSingleTableRetired reports whether err is the single table's update
// guard (SingleTableRetiredCode).
func IsSingleTableRetired(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == SingleTableRetiredCode
}

// IsSingleTableClosed reports whether err is the single table's insert guard
// (SingleTableClosedCode).
func IsSingleTableClosed(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == SingleTableClosedCode
}

// Answered reports whether err carries an answer of the server, and if so
// whether that answer says the server or its resources failed (SQLSTATE
// classes 08 connection, 53 resources, 57 operator, 58 system, XX
// internal) rather than the statement.
func Answered(err error) (answered, serverFault bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false, false
	}
	switch class(pgErr) {
	case "08", "53", "57", "58", "XX":
		return true, true
	}
	return true, false
}

func class(e *pgconn.PgError) string {
	if len(e.Code) < 2 {
		return e.Code
	}
	return e.Code[:2]
}

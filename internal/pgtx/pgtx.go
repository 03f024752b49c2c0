// Package pgtx holds the one way a transaction is ended when its work did
// not commit it.
package pgtx

import (
	"context"
	"time"
)

// RollbackTimeout bounds Rollback.
const RollbackTimeout = 5 * time.Second

// Rollback ends tx if it is still open, also when ctx is already cancelled
// (a cancelled message, a shutdown), within RollbackTimeout. Its error is
// dropped: on a committed transaction it is pgx.ErrTxClosed, and on a broken
// connection pgx closes the connection, which ends the transaction on the
// server.
func Rollback(ctx context.Context, tx interface{ Rollback(context.Context) error }) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

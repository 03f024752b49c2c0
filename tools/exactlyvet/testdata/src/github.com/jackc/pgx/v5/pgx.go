// Package pgx is the part of pgx/v5's API that the analyzer looks at.
package pgx

import "context"

type Rows interface{ Close() }
type Row interface{ Scan(dest ...any) error }
type CommandTag struct{}
type Batch struct{}
type BatchResults interface{ Close() error }

type Tx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	Exec(ctx context.Context, sql string, args ...any) (CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	SendBatch(ctx context.Context, b *Batch) BatchResults
}

type Conn struct{}

func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (CommandTag, error) {
	return CommandTag{}, nil
}
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) Row { return nil }
func (c *Conn) Begin(ctx context.Context) (Tx, error)                     { return nil, nil }

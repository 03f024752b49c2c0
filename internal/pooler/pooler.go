// Package pooler tells whether a pool's connections go through a
// connection pooler (PgBouncer, a managed proxy), and whether that pooler
// hands a client's statements to more than one server session (transaction
// or statement pooling), where no session state holds: session advisory
// locks, LISTEN, a startup search_path, server-side prepared statements.
package pooler

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pidSQL asks for the server session's process ID, with the simple
// protocol: it leaves no statement on the server, whatever the pool's
// QueryExecMode.
const pidSQL = "SELECT pg_catalog.pg_backend_pid()"

// Info is what Detect found.
type Info struct {
	// Pooler is true when the server session's process ID differs from the
	// one the connection was given at start-up: something stands between
	// the client and the server.
	Pooler bool
	// Transaction is true when a client connection's statements were seen
	// on two server sessions (or one server session served two client
	// connections at once), or, behind a pooler, when it could not be told
	// (a pool of one connection): no session state may be relied on.
	Transaction bool
	// Sure is false when Transaction is a guess.
	Sure bool
}

// Detect looks at pool's connections. It takes one connection of the pool,
// and a second for a moment, within a second, behind a pooler.
func Detect(ctx context.Context, pool *pgxpool.Pool) (Info, error) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return Info{}, err
	}
	defer a.Release()
	var first uint32
	if err := a.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&first); err != nil {
		return Info{}, err
	}
	if first == a.Conn().PgConn().PID() {
		return Info{Sure: true}, nil
	}
	info := Info{Pooler: true, Transaction: true}
	if pool.Config().MaxConns < 2 {
		return info, nil
	}
	// B opens a transaction: a transaction pooler gives it a server session
	// for as long as it lasts, most likely the one A's statement just gave
	// back; a session pooler never gives it A's. Then A asks again: behind a
	// transaction pooler it cannot have its session while B holds it.
	bctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	b, err := pool.Acquire(bctx)
	if err != nil {
		return info, nil // cannot tell: assume the worst
	}
	defer b.Release()
	tx, err := b.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Info{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var other, again uint32
	if err := tx.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&other); err != nil {
		return Info{}, err
	}
	if err := a.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&again); err != nil {
		return Info{}, err
	}
	if other == first || again != first {
		return Info{Pooler: true, Transaction: true, Sure: true}, nil
	}
	// A kept its session while B held another: session pooling, or a
	// transaction pooler with sessions to spare that gave A its own back.
	// One more look, with B's session free and A's taken by a transaction.
	if err := tx.Rollback(ctx); err != nil {
		return Info{}, err
	}
	atx, err := a.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Info{}, err
	}
	defer func() { _ = atx.Rollback(context.WithoutCancel(ctx)) }()
	if err := atx.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&again); err != nil {
		return Info{}, err
	}
	if err := b.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&other); err != nil {
		return Info{}, err
	}
	if again != first || other == first {
		return Info{Pooler: true, Transaction: true, Sure: true}, nil
	}
	return Info{Pooler: true, Sure: true}, nil
}

// Stateful is true for the QueryExecModes that need a server session to keep
// a statement between two round trips: cache_statement (a named prepared
// statement, kept for later calls) and describe_exec (the unnamed statement
// described in one round trip and run in the next).
func Stateful(mode pgx.QueryExecMode) bool {
	return mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec
}

// CheckExecMode returns an error naming the fix when pool's exec mode
// cannot work behind what Detect found, or nil. who names the caller
// ("pgstore").
func CheckExecMode(who string, pool *pgxpool.Pool, info Info) error {
	mode := pool.Config().ConnConfig.DefaultQueryExecMode
	if !info.Transaction || !Stateful(mode) {
		return nil
	}
	name := map[pgx.QueryExecMode]string{pgx.QueryExecModeCacheStatement: "cache_statement (pgx's default)", pgx.QueryExecModeDescribeExec: "describe_exec"}[mode]
	how := "a client's statements run on more than one server session"
	if !info.Sure {
		how = "it could not be told whether a client's statements stay on one server session (a pool of one connection), so it is assumed they do not"
	}
	return fmt.Errorf("%s: the pool's connections go through a connection pooler in transaction mode (%s), where pgx's QueryExecMode %s cannot work: "+
		"its statements are prepared on one server session and run on another (\"prepared statement ... already exists\" or \"does not exist\"): "+
		"set default_query_exec_mode=exec (or cache_describe, or simple_protocol) in the connection string, "+
		"or connect directly or through a pooler in session mode", who, how, name)
}

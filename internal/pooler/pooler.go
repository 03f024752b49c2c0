// Package pooler tells whether a pool's connections go through a
// connection pooler (PgBouncer, a managed proxy). Such a pooler may hand a
// client's statements to more than one server session (transaction or
// statement pooling), where no session state holds: session advisory
// locks, LISTEN, a startup search_path, server-side prepared statements.
package pooler

import (
	"context"
	"fmt"

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
	// Transaction is true when no session state may be relied on: behind
	// any pooler. A client cannot prove that a pooler runs in session mode
	// (a transaction pooler with sessions to spare may give a client's
	// statements the same server session for a long while), so a pooler is
	// taken to run in transaction mode.
	Transaction bool
}

// Detect looks at one of pool's connections.
func Detect(ctx context.Context, pool *pgxpool.Pool) (Info, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return Info{}, err
	}
	defer c.Release()
	var pid uint32
	if err := c.QueryRow(ctx, pidSQL, pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return Info{}, err
	}
	if pid == c.Conn().PgConn().PID() {
		return Info{}, nil
	}
	return Info{Pooler: true, Transaction: true}, nil
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
	return fmt.Errorf("%s: the pool's connections go through a connection pooler (the server session's process ID is not the one the connection "+
		"was given at start-up), which may run in transaction mode, where pgx's QueryExecMode %s cannot work: "+
		"its statements are prepared on one server session and run on another (\"prepared statement ... already exists\" or \"does not exist\"): "+
		"set default_query_exec_mode=exec (or cache_describe, or simple_protocol) in the connection string, "+
		"or connect directly", who, name)
}

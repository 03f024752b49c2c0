package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/embedpg"
)

// openDemoDB connects the demo to its Postgres: DatabaseURL when one was
// given (DATABASE_URL or the flag), else the server at DefaultDatabaseURL,
// else a throwaway server started for the demo's lifetime. release closes
// the pool and stops and removes that server.
func openDemoDB(ctx context.Context, cfg DemoConfig) (pool *pgxpool.Pool, release func(), err error) {
	given := cfg.DatabaseURL != DefaultDatabaseURL || os.Getenv("DATABASE_URL") != ""
	return openDB(ctx, cfg.DatabaseURL, !given, cfg.Progress, cfg.Logger)
}

// openDB connects to url; if that fails and embed is set, it starts a
// throwaway server instead.
func openDB(ctx context.Context, url string, embed bool, progress io.Writer, logger *slog.Logger) (*pgxpool.Pool, func(), error) {
	pool, err := connect(ctx, url)
	if err == nil {
		return pool, pool.Close, nil
	}
	if !embed {
		return nil, nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	fmt.Fprintf(progress, "ledger demo: no Postgres at %s (set DATABASE_URL to use one); starting a throwaway server …\n", where(url))
	srv, serr := embedpg.Start(ctx, &embedpg.Config{Logger: logger})
	if serr != nil {
		return nil, nil, fmt.Errorf("%w\n  and no throwaway server either: %w", err, serr)
	}
	fmt.Fprintf(progress, "ledger demo: PostgreSQL from %s in %s (removed on exit)\n", srv.BinDir(), srv.Dir())
	pool, err = connect(ctx, srv.URL())
	if err != nil {
		_ = srv.Stop()
		return nil, nil, err
	}
	return pool, func() {
		pool.Close()
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(progress, "ledger demo: stop the throwaway server:", err)
		}
	}, nil
}

// newPool makes a pool on url without connecting: the worker waits for
// Postgres itself.
func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("ledger: database URL %s: %w", where(url), withoutDSN(err))
	}
	// A connection per partition handler, plus the relay's two.
	pcfg.MaxConns = max(pcfg.MaxConns, 16)
	return pgxpool.NewWithConfig(ctx, pcfg)
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	var pool *pgxpool.Pool
	if err == nil {
		// A connection per partition handler, plus the relay's two.
		pcfg.MaxConns = max(pcfg.MaxConns, 16)
		pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	}
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: cannot reach Postgres at %s: %w\n  start one with `docker compose up -d postgres` (or scripts/postgres.sh start), or set DATABASE_URL", where(url), withoutDSN(err))
	}
	return pool, nil
}

// where names the Postgres a connection string points at, for messages:
// the user, host, port and database, never the password (the string can
// carry one in its user info, a query parameter or a key=value pair).
func where(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(a connection string that does not parse)"
	}
	return fmt.Sprintf("postgres://%s@%s/%s", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
}

// withoutDSN is err, unless it is a connection string's parse error: that
// quotes the string, and pgconn masks only the passwords it recognises in
// it (a malformed string can hide one), so the text names the forms instead.
func withoutDSN(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("not a Postgres connection string (postgres://user:password@host:port/database?… or host=… port=… key=value pairs)")
	}
	return err
}

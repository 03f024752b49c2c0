package ledger

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/embedpg"
	"github.com/exactly-go/exactly/internal/redact"
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
	fmt.Fprintf(progress, "ledger demo: no Postgres at %s (set DATABASE_URL to use one); starting a throwaway server …\n", redact.Password(url))
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

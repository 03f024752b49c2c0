package pgtest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolerEnv names the variable that holds the URL of a connection pooler
// (PgBouncer, scripts/pgbouncer.sh) in front of the test server, in
// transaction mode unless PoolerModeEnv says otherwise.
const PoolerEnv = "TEST_POOLER_URL"

// PoolerModeEnv names the variable that gives the pooler's pool mode:
// transaction (the default) or session.
const PoolerModeEnv = "TEST_POOLER_MODE"

// ViaPoolerEnv names the variable that, set to 1 with PoolerEnv, makes the
// shared pool (Pool, and every DB's) go through the pooler, so that whole
// suites run behind it (make test-pooler). The migrations of New still run
// on a direct connection (migrations.Migrate refuses a transaction
// pooler), and so do the programs a test starts with RequireURL.
const ViaPoolerEnv = "TEST_VIA_POOLER"

// ViaPooler reports whether the shared pool goes through the pooler.
func ViaPooler() bool { return os.Getenv(ViaPoolerEnv) == "1" && os.Getenv(PoolerEnv) != "" }

var direct struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

// migrationPool is the pool New migrates on: the shared one, or a direct
// one when the shared pool goes through the pooler.
func migrationPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	if !ViaPooler() {
		return Pool(t)
	}
	direct.once.Do(func() {
		u, err := URL()
		if err != nil {
			direct.err = err
			return
		}
		cfg, err := Config(u)
		if err != nil {
			direct.err = err
			return
		}
		cfg.MaxConns = 4
		direct.pool, direct.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if direct.err != nil {
		t.Fatalf("pgtest: direct pool: %v", direct.err)
	}
	return direct.pool
}

// PoolerURL returns the pooler's URL, or skips t when PoolerEnv is unset:
// the tests behind a pooler run in make test-pooler (a cell of .ci/run).
func PoolerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(PoolerEnv)
	if u == "" {
		t.Skipf("%s is not set: run make test-pooler (scripts/pgbouncer.sh start prints the URL)", PoolerEnv)
	}
	return u
}

// PoolerMode returns the pooler's pool mode (PoolerModeEnv).
func PoolerMode() string {
	if m := os.Getenv(PoolerModeEnv); m != "" {
		return m
	}
	return "transaction"
}

// PoolerPool returns a pool whose connections go through the pooler
// (PoolerURL), closed when t ends; edit, when not nil, adjusts its
// configuration first. The pooler drops the startup search_path, so
// nothing pins it: every statement must name its schema.
func PoolerPool(t testing.TB, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	u := PoolerURL(t)
	cfg, err := Config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

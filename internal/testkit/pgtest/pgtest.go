// Package pgtest gives each test a Postgres schema of its own.
//
// The server comes from TEST_DATABASE_URL, then DATABASE_URL, then a
// testcontainers-go Postgres when a Docker engine answers (host network,
// 127.0.0.1, a free port), then a local server at
// postgres://postgres:postgres@localhost:5432/postgres. Without one the test
// is skipped (with CI=true it fails). Each test logs which it got.
//
// The pool's search_path is pinned to pg_catalog, so a query that forgets to
// qualify a table name with the configured schema fails instead of quietly
// using another schema's table.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/migrations"
)

// LocalURL is where a server started from a local install is looked for.
const LocalURL = "postgres://postgres:postgres@localhost:5432/postgres"

// Image is the Postgres image used with testcontainers (internal/testservices
// starts it); it matches docker-compose.yml.
const Image = "postgres:15-alpine"

var server struct {
	once  sync.Once
	url   string
	src   testenv.Source
	where string
	pool  *pgxpool.Pool
	err   error
}

// URL resolves the server's URL once per process.
func URL() (string, error) {
	server.once.Do(func() { server.url, server.src, server.where, server.err = resolve() })
	return server.url, server.err
}

// Source says where the server came from and its address; both are empty
// until URL has resolved it.
func Source() (testenv.Source, string) {
	if _, err := URL(); err != nil {
		return "", ""
	}
	return server.src, server.where
}

func resolve() (url string, src testenv.Source, where string, err error) {
	for _, env := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(env); u != "" {
			if err := ping(u); err != nil {
				return "", "", "", fmt.Errorf("%s is set but Postgres does not answer there: %w", env, err)
			}
			return u, testenv.SourceEnv, "$" + env, nil
		}
	}
	var reasons []string
	if ok, why := testenv.DockerAvailable(); ok {
		u, where, err := testenv.Container("postgres")
		if err == nil {
			return u, testenv.SourceContainer, where, nil
		}
		reasons = append(reasons, fmt.Sprintf("testcontainers: %v", err))
	} else {
		reasons = append(reasons, fmt.Sprintf("no Docker engine for testcontainers (%v)", why))
	}
	if err := ping(LocalURL); err == nil {
		return LocalURL, testenv.SourceLocal, fmt.Sprintf("%s (%s)", hostPort(LocalURL), strings.Join(reasons, "; ")), nil
	} else {
		reasons = append(reasons, fmt.Sprintf("no local server at %s (%v)", LocalURL, err))
	}
	return "", "", "", fmt.Errorf("no Postgres: set TEST_DATABASE_URL, or start one (make up, or .ci/run's commands): %s", strings.Join(reasons, "; "))
}

func hostPort(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

func ping(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// RequireURL returns the test server's URL, for a test that hands it to a
// program of its own. It skips t (fails under CI) when there is no server.
func RequireURL(t testing.TB) string {
	t.Helper()
	u, err := URL()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	return u
}

// Pool returns the process-wide pool, search_path pinned to pg_catalog
// (behind a pooler that drops it, see ViaPooler, nothing is pinned).
// It skips t (fails under CI) when there is no server.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u, err := URL()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	testenv.Report(t, "Postgres", server.src, server.where)
	poolOnce.Do(func() {
		if ViaPooler() {
			u = os.Getenv(PoolerEnv) // the code under test goes through the pooler
		}
		cfg, err := Config(u)
		if err != nil {
			poolErr = err
			return
		}
		server.pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if poolErr != nil {
		t.Fatalf("pgtest: pool: %v", poolErr)
	}
	return server.pool
}

// Config parses url into a pool config with search_path pinned to pg_catalog.
func Config(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "pg_catalog"
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = filepath.Base(os.Args[0])
	}
	// Up to 48 connections while a package's tests run in parallel, but none
	// kept idle for long: two test binaries run at once (go test -p), next to
	// the worker processes some tests start, and a server's default
	// max_connections is 100.
	cfg.MaxConns = 48
	cfg.MaxConnIdleTime = 2 * time.Second
	cfg.HealthCheckPeriod = time.Second
	return cfg, nil
}

var (
	poolOnce sync.Once
	poolErr  error
)

// DB is a test's own schema on the shared pool.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
}

// Table returns the schema-qualified, quoted name of table.
func (d *DB) Table(table string) string { return pgx.Identifier{d.Schema, table}.Sanitize() }

// NewEmpty creates an empty schema, dropped when t ends.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	pool := Pool(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return &DB{Pool: pool, Schema: schema}
}

// New creates a schema with exactly's migrations applied, dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	d := NewEmpty(t)
	if err := migrations.Migrate(context.Background(), migrationPool(t), &migrations.Config{Schema: d.Schema}); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	return d
}

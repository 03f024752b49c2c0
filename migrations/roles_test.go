package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// admin returns the shared test pool, whose role must be able to create
// roles; it skips t (fails under CI) when it cannot.
func admin(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	var ok bool
	if err := pool.QueryRow(context.Background(),
		"SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user").Scan(&ok); err != nil {
		t.Fatal(err)
	}
	if !ok {
		testenv.Missing(t, "the test database's role cannot create roles (needs CREATEROLE)")
	}
	return pool
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// exec runs each statement on pool, failing t on the first error.
func exec(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// dropRolesAtEnd drops roles, and everything they own or were granted in
// this database, when t ends (after the pools connected as them close).
func dropRolesAtEnd(t *testing.T, pool *pgxpool.Pool, roles ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range roles {
			q := pgx.Identifier{r}.Sanitize()
			if _, err := pool.Exec(ctx, "DROP OWNED BY "+q+" CASCADE"); err != nil {
				t.Errorf("drop owned by %s: %v", r, err)
			}
			if _, err := pool.Exec(ctx, "DROP ROLE "+q); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})
}

// newRole creates a login role with nothing but what PUBLIC has, dropped
// when t ends.
func newRole(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	exec(t, pool, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN")
	dropRolesAtEnd(t, pool, name)
}

// connectAs sets a password for role and returns a pool that logs in as it,
// closed when t ends. Its search_path is pg_catalog, as the shared pool's.
func connectAs(t *testing.T, admin *pgxpool.Pool, role string) *pgxpool.Pool {
	t.Helper()
	password := randomName("pw")
	exec(t, admin, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD '"+password+"'")
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgtest.Config(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var who string
	if err := pool.QueryRow(context.Background(), "SELECT current_user").Scan(&who); err != nil || who != role {
		t.Fatalf("connected as %q (%v), want %q", who, err, role)
	}
	return pool
}

// denied reports whether err is Postgres' insufficient_privilege.
func denied(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501"
}

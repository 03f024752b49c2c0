package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RowsOnlyPool returns a pool connected as a new role that may read and
// write the rows of d's tables and use its sequences, and nothing more (no
// DDL, owns nothing): a production consumer's role. The role is dropped
// when t ends.
func (d *DB) RowsOnlyPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	s := pgx.Identifier{d.Schema}.Sanitize()
	return d.RolePool(t, "GRANT USAGE ON SCHEMA "+s+" TO {role}",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+s+" TO {role}",
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "+s+" TO {role}")
}

// RolePool returns a pool connected as a new login role, given the rights
// of grants (statements in which {role} stands for the role's quoted
// name). The role is dropped when t ends.
func (d *DB) RolePool(t testing.TB, grants ...string) *pgxpool.Pool {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "t_role_" + hex.EncodeToString(b)
	password := hex.EncodeToString(b) + "-pw"
	r := pgx.Identifier{role}.Sanitize()
	ctx := context.Background()
	for _, q := range append([]string{"CREATE ROLE {role} LOGIN PASSWORD '" + password + "'"}, grants...) {
		q = strings.ReplaceAll(q, "{role}", r)
		if _, err := d.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("pgtest: %s: %v", q, err)
		}
	}
	u, err := neturl.Parse(RequireURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.UserPassword(role, password)
	cfg, err := Config(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = d.Pool.Exec(ctx, "DROP OWNED BY "+r)
		_, _ = d.Pool.Exec(ctx, "DROP ROLE "+r)
	})
	return pool
}

package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/migrations"
)

// TestMigrateAsSchemaOwner: a role that owns its schema but has no CREATE
// on the database migrates up, again (nothing to do), down and up; the
// tables are its own. A schema it does not have is refused with an error
// that says what to do, and nothing is created.
func TestMigrateAsSchemaOwner(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	owner := randomName("t_owner_")
	newRole(t, adm, owner)
	var canCreate bool
	if err := adm.QueryRow(ctx, "SELECT has_database_privilege($1, current_database(), 'CREATE')", owner).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	if canCreate {
		t.Fatalf("role %s has CREATE on the test database (granted to PUBLIC?): this test needs a role without it", owner)
	}
	schema := randomName("t_")
	exec(t, adm, "CREATE SCHEMA "+schema+" AUTHORIZATION "+owner)
	pool := connectAs(t, adm, owner)

	opts := &migrations.Opts{Schema: schema}
	for i, step := range []func() error{
		func() error { return migrations.Migrate(ctx, pool, opts) },
		func() error { return migrations.Migrate(ctx, pool, opts) },
		func() error { return migrations.Down(ctx, pool, opts) },
		func() error { return migrations.Migrate(ctx, pool, opts) },
	} {
		if err := step(); err != nil {
			t.Fatalf("step %d as the schema's owner: %v", i, err)
		}
	}
	cur, latest, err := migrations.Version(ctx, pool, opts)
	if err != nil || cur != latest {
		t.Fatalf("version %d of %d (%v)", cur, latest, err)
	}
	var owned, all int
	if err := adm.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tableowner = $2), count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1`,
		schema, owner).Scan(&owned, &all); err != nil {
		t.Fatal(err)
	}
	if all != 4 || owned != all {
		t.Fatalf("%d tables in %s, %d owned by %s; want 4, all of them", all, schema, owned, owner)
	}

	missing := randomName("t_")
	err = migrations.Migrate(ctx, pool, &migrations.Opts{Schema: missing})
	if err == nil || !strings.Contains(err.Error(), "create it beforehand") || !denied(err) {
		t.Fatalf("migrating a missing schema without CREATE on the database: err = %v", err)
	}
	var exists bool
	if err := adm.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", missing).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s exists = %v (%v)", missing, exists, err)
	}
}

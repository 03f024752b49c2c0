package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
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

	opts := &migrations.Config{Schema: schema}
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
	if all != 12 || owned != all {
		t.Fatalf("%d tables in %s, %d owned by %s; want 12, all of them", all, schema, owned, owner)
	}

	missing := randomName("t_")
	err = migrations.Migrate(ctx, pool, &migrations.Config{Schema: missing})
	if err == nil || !strings.Contains(err.Error(), "create it beforehand") || !denied(err) {
		t.Fatalf("migrating a missing schema without CREATE on the database: err = %v", err)
	}
	var exists bool
	if err := adm.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", missing).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s exists = %v (%v)", missing, exists, err)
	}
}

// TestMigrateWhileSchemaIsCreated: another session creates the schema
// after Migrate looked for it and before Migrate's own CREATE SCHEMA IF NOT
// EXISTS commits (which then fails with a unique violation): Migrate finds
// the schema there and goes on.
func TestMigrateWhileSchemaIsCreated(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	schema := randomName("t_")
	t.Cleanup(func() { _, _ = adm.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	other, err := adm.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(context.Background()) }()
	if _, err := other.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- migrations.Migrate(ctx, adm, &migrations.Config{Schema: schema}) }()
	testenv.WaitFor(t, 30*time.Second, "Migrate to wait for the other session's schema", func() bool {
		var n int
		err := adm.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_stat_activity
WHERE wait_event_type = 'Lock' AND query = $1`, `CREATE SCHEMA IF NOT EXISTS "`+schema+`"`).Scan(&n)
		return err == nil && n == 1
	})
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var tables int
	if err := adm.QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1", schema).Scan(&tables); err != nil || tables != 12 {
		t.Fatalf("%d tables in %s (%v), want 12", tables, schema, err)
	}
}

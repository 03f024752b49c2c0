package migrations_test

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
)

func tables(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		"SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name", db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	return names
}

func TestUpDownUp(t *testing.T) {
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	opts := &migrations.Config{Schema: db.Schema}
	for round := 0; round < 2; round++ {
		if err := migrations.Migrate(ctx, db.Pool, opts); err != nil {
			t.Fatalf("up %d: %v", round, err)
		}
		got := strings.Join(tables(t, db), ",")
		if got != "exactly_goose_db_version,exactly_key_names,exactly_keys,exactly_keys2,exactly_keys2_other,exactly_keys2_state,exactly_outbox,exactly_outbox_waiters,exactly_positions,exactly_positions_claims,exactly_redrives,exactly_scopes" {
			t.Fatalf("after up: tables %s", got)
		}
		cur, latest, err := migrations.Version(ctx, db.Pool, opts)
		if err != nil || cur != latest || cur < 1 {
			t.Fatalf("version %d/%d %v", cur, latest, err)
		}
		// Up again is a no-op.
		if err := migrations.Migrate(ctx, db.Pool, opts); err != nil {
			t.Fatal(err)
		}
		if err := migrations.Down(ctx, db.Pool, opts); err != nil {
			t.Fatalf("down %d: %v", round, err)
		}
		if got := strings.Join(tables(t, db), ","); got != "exactly_goose_db_version" {
			t.Fatalf("after down: tables %s", got)
		}
	}
}

// TestOwnVersionTable: a service's own goose history in the same schema is
// untouched, and ours does not collide with it.
func TestOwnVersionTable(t *testing.T) {
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("goose_db_version")+" (id serial, version_id bigint, is_applied bool, tstamp timestamp default now())"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("goose_db_version")+" (version_id, is_applied) VALUES (0, true), (1, true), (2, true)"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Migrate(ctx, db.Pool, &migrations.Config{Schema: db.Schema}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("goose_db_version")).Scan(&n); err != nil || n != 3 {
		t.Fatalf("service's version table has %d rows (%v), want 3", n, err)
	}
}

// TestConcurrentMigrate: processes starting at once migrate once; the
// others wait on the lock and find nothing to do.
func TestConcurrentMigrate(t *testing.T) {
	db := pgtest.NewEmpty(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- migrations.Migrate(context.Background(), db.Pool, &migrations.Config{Schema: db.Schema})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var applied int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Table(migrations.VersionTable)+" WHERE version_id > 0").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	entries, _ := fs.Glob(migrations.FS, "*.sql")
	if applied != len(entries) {
		t.Fatalf("%d migrations recorded, want %d (each once)", applied, len(entries))
	}
}

func TestBadSchema(t *testing.T) {
	db := pgtest.NewEmpty(t)
	err := migrations.Migrate(context.Background(), db.Pool, &migrations.Config{Schema: "x; DROP TABLE y"})
	if err == nil || !strings.Contains(err.Error(), "Config.Schema") {
		t.Fatalf("err = %v", err)
	}
}

func TestFS(t *testing.T) {
	entries, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(entries) == 0 || entries[0] != "00001_keys.sql" {
		t.Fatalf("FS: %v %v", entries, err)
	}
}

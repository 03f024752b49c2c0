package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/exactly-go/exactly/internal/advisory"
	"github.com/exactly-go/exactly/internal/pooler"
	"github.com/exactly-go/exactly/internal/sqlident"
)

//go:embed sql/*.sql
var embedded embed.FS

// FS holds the goose SQL migrations, at its root. The SQL names tables
// without a schema: run it with search_path set to the target schema.
var FS fs.FS = mustSub(embedded, "sql")

// VersionTable is the goose version table that Migrate uses, in Config.Schema.
const VersionTable = "exactly_goose_db_version"

// Config tunes Migrate and Down.
type Config struct {
	// Schema receives the tables and the version table. Migrate creates it
	// when missing, which needs CREATE on the database; a schema that
	// exists needs only USAGE and CREATE on it (its owner has both).
	// Defaults to the first schema of the pool's search_path (set it in the
	// connection string: ?search_path=ledger), else "public": the key store
	// and the outbox default to the same one.
	Schema string
	// Version is the target version: Migrate goes up to it (0: the latest),
	// Down goes down to it (0: removes everything). Defaults to 0.
	Version int64
	// Logger receives one line per applied migration. Defaults to no logging.
	Logger *slog.Logger
}

func (o *Config) withDefaults(pool *pgxpool.Pool) (Config, error) {
	var c Config
	if o != nil {
		c = *o
	}
	if c.Schema == "" {
		c.Schema = defaultSchema(pool)
	}
	if err := sqlident.Check("migrations: Config.Schema", c.Schema); err != nil {
		return c, err
	}
	if c.Version < 0 {
		return c, fmt.Errorf("migrations: Config.Version is %d: use 0 or a positive version", c.Version)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Migrate applies every pending migration (up to cfg.Version when set).
// The SQL names no schema: it runs with search_path set to Config.Schema,
// and Migrate refuses, naming the fix, where that cannot hold: behind a
// connection pooler, or a proxy that changes the session's search_path
// (run it on a direct connection there).
func Migrate(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	o, err := cfg.withDefaults(pool)
	if err != nil {
		return err
	}
	if err := ensureSchema(ctx, pool, o.Schema); err != nil {
		return err
	}
	return withProvider(ctx, pool, o, true, func(p *goose.Provider) error {
		var results []*goose.MigrationResult
		var err error
		if o.Version == 0 {
			results, err = p.Up(ctx)
		} else {
			results, err = p.UpTo(ctx, o.Version)
		}
		logResults(o, results)
		return err
	})
}

// Down reverts migrations down to cfg.Version (0: all of them, dropping
// every table exactly owns in cfg.Schema).
func Down(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	o, err := cfg.withDefaults(pool)
	if err != nil {
		return err
	}
	return withProvider(ctx, pool, o, true, func(p *goose.Provider) error {
		results, err := p.DownTo(ctx, o.Version)
		logResults(o, results)
		return err
	})
}

// Version returns the schema's applied version and the latest version that
// this build knows.
func Version(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (current, latest int64, err error) {
	o, err := cfg.withDefaults(pool)
	if err != nil {
		return 0, 0, err
	}
	err = withProvider(ctx, pool, o, false, func(p *goose.Provider) error {
		current, latest, err = p.GetVersions(ctx)
		return err
	})
	return current, latest, err
}

// ensureSchema creates schema when it is missing. It looks first: CREATE
// SCHEMA, even with IF NOT EXISTS, needs CREATE on the database, which the
// owner of an existing schema need not have.
func ensureSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	exists := func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", schema).Scan(&ok)
		if err != nil {
			return false, fmt.Errorf("migrations: look for schema %s: %w", schema, err)
		}
		return ok, nil
	}
	if ok, err := exists(); ok || err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		// Another process may have created it meanwhile (concurrent CREATE
		// SCHEMA IF NOT EXISTS can fail with a unique violation).
		if ok, _ := exists(); ok {
			return nil
		}
		return fmt.Errorf("migrations: create schema %s (create it beforehand, owned by the migrating role, or grant CREATE on the database): %w", schema, err)
	}
	return nil
}

func logResults(o Config, results []*goose.MigrationResult) {
	for _, r := range results {
		o.Logger.Info("migration applied", "schema", o.Schema, "version", r.Source.Version,
			"direction", r.Direction, "duration", r.Duration)
	}
}

// withProvider opens a database/sql handle on the pool's connection settings
// with search_path pinned to the schema, and runs f with a goose Provider.
// When the migrations change the schema (changes), it first makes sure
// that they land in it (checkSession).
func withProvider(ctx context.Context, pool *pgxpool.Pool, o Config, changes bool, f func(*goose.Provider) error) error {
	cc := pool.Config().ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["search_path"] = o.Schema
	// A pooler may drop the startup search_path (PgBouncer's
	// ignore_startup_parameters): each session sets it again, and the
	// migrations run only where it took (checkSession).
	setPath := "SET search_path TO " + pgx.Identifier{o.Schema}.Sanitize()
	db := stdlib.OpenDB(*cc, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, setPath, pgx.QueryExecModeSimpleProtocol)
		return err
	}))
	defer db.Close()
	db.SetMaxOpenConns(2)
	if changes {
		if err := checkSession(ctx, pool, db, o.Schema); err != nil {
			return err
		}
	}

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(o.Schema)), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	store, err := database.NewStore(goose.DialectPostgres, o.Schema+"."+VersionTable) // both checked by sqlident
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider("", db, FS,
		goose.WithStore(store),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if err := f(p); err != nil {
		var pe *goose.PartialError
		if errors.As(err, &pe) && pe.Failed != nil {
			return fmt.Errorf("migrations: schema %s, version %d (%s): %w", o.Schema, pe.Failed.Source.Version, pe.Failed.Source.Path, pe.Err)
		}
		return fmt.Errorf("migrations: schema %s: %w", o.Schema, err)
	}
	return nil
}

// checkSession refuses to migrate where the SQL's unqualified names would
// not land in schema: behind a pooler (in transaction mode the search_path
// set for a session and goose's session lock do not hold from one
// statement to the next, and a client cannot tell session mode from it) or
// on a session whose search_path does not start with schema.
func checkSession(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, schema string) error {
	info, err := pooler.Detect(ctx, pool)
	if err != nil {
		return fmt.Errorf("migrations: schema %s: look at the connection: %w", schema, err)
	}
	if info.Transaction {
		return fmt.Errorf("migrations: schema %s: the pool's connections go through a connection pooler, which may run in transaction mode, "+
			"where the migrations' search_path and their lock do not hold from one statement to the next (the tables would land in another schema): "+
			"run Migrate on a direct connection to the server", schema)
	}
	var current sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT pg_catalog.current_schema()").Scan(&current); err != nil {
		return fmt.Errorf("migrations: schema %s: %w", schema, err)
	}
	if current.String != schema {
		return fmt.Errorf("migrations: schema %s: the session's search_path puts the tables in %q, not in the schema: "+
			"a pooler or proxy between the client and the server changes it; run Migrate on a direct connection to the server", schema, current.String)
	}
	return nil
}

// lockID is the advisory lock that serialises migrations of one schema:
// migrations of different schemas do not wait for each other.
// defaultSchema is Config.Schema's default on pool.
func defaultSchema(pool *pgxpool.Pool) string {
	if pool == nil {
		return sqlident.DefaultSchema(nil)
	}
	return sqlident.DefaultSchema(pool.Config().ConnConfig)
}

func lockID(schema string) int64 { return advisory.LockID("migrations/" + schema) }

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}

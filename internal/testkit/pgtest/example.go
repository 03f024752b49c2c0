package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// Main runs a package's tests and examples (call it from TestMain). An
// example cannot skip itself, so when there is no Postgres server the
// examples are left out of the run (-test.skip ^Example) with a line on
// stderr saying why; under CI=true that is a failure instead.
func Main(m *testing.M) {
	flag.Parse()
	if _, err := URL(); err != nil {
		if testenv.CI() {
			fmt.Fprintf(os.Stderr, "pgtest: CI=true and the examples need Postgres: %v\n", err)
			os.Exit(1)
		}
		skip := "^Example"
		if prev := flag.Lookup("test.skip"); prev != nil && prev.Value.String() != "" {
			skip = prev.Value.String() + "|" + skip
		}
		if err := flag.Set("test.skip", skip); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "pgtest: examples skipped: %v\n", err)
	}
	os.Exit(m.Run())
}

// ExampleDB returns a pool on the test server and the name of a new, empty
// schema, for a runnable example; drop removes the schema and closes the
// pool. Unlike Pool, the pool's search_path is the server's default: an
// example's queries name their schema as a user's would. It panics when
// there is no server (Main keeps examples from running then).
func ExampleDB() (pool *pgxpool.Pool, schema string, drop func()) {
	url, err := URL()
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if pool, err = pgxpool.New(ctx, url); err != nil {
		panic(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "example_" + hex.EncodeToString(b)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(fmt.Sprintf("pgtest: create schema: %v", err))
	}
	return pool, schema, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			panic(fmt.Sprintf("pgtest: drop schema %s: %v", schema, err))
		}
		pool.Close()
	}
}

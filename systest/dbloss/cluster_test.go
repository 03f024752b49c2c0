package dbloss_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/systest/pgcluster"
)

// pgBin holds the server binaries the clusters run with.
const pgBin = "/usr/lib/postgresql/15/bin"

// requireClusters skips (fails under CI=true) when the test cannot run
// clusters of its own.
func requireClusters(t *testing.T) {
	t.Helper()
	pgcluster.Require(t, "dbloss", pgBin)
}

// newPrimary creates a cluster with initdb and starts it, ready to stream
// to standbys and to serve base backups.
func newPrimary(t *testing.T, base, name string) *pgcluster.Cluster {
	t.Helper()
	c := pgcluster.Init(t, pgBin, base, name, "wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\nmax_connections = 100\nshared_buffers = 32MB\nfsync = off\n")
	must(t, c.Start())
	return c
}

// backup copies c with pg_basebackup into a new cluster name; standby makes
// it an asynchronous streaming standby of c. It is not started.
func backup(t *testing.T, c *pgcluster.Cluster, base, name string, standby bool) *pgcluster.Cluster {
	t.Helper()
	b := pgcluster.New(t, pgBin, base, name)
	must(t, c.Backup(b, standby))
	return b
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pool connects to c's postgres database.
func pool(t *testing.T, c *pgcluster.Cluster, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(c.URL() + "&application_name=" + app)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 12
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// lsn returns the result of an LSN function (pg_current_wal_flush_lsn(),
// pg_last_wal_replay_lsn()) on pool, as text.
func lsn(t *testing.T, pool *pgxpool.Pool, fn string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), "SELECT "+fn+"::text").Scan(&s); err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
	return s
}

// lsnAhead reports whether LSN a is ahead of LSN b.
func lsnAhead(t *testing.T, pool *pgxpool.Pool, a, b string) bool {
	t.Helper()
	var ahead bool
	if err := pool.QueryRow(context.Background(), "SELECT $1::pg_lsn > $2::pg_lsn", a, b).Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	return ahead
}

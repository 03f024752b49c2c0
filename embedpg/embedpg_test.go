//go:build unix

package embedpg_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/embedpg"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/migrations"
)

// exercise runs the migrations and a query on a started server, checks who
// runs it, then stops it and checks that nothing is left: no process, no
// directory, no listener.
func exercise(t *testing.T, srv *embedpg.Server) {
	t.Helper()
	ctx := context.Background()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = srv.Stop()
		}
	})
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: "embedded"}); err != nil {
		t.Fatal(err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'embedded'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables == 0 {
		t.Fatal("the migrations created no table in the embedded server")
	}
	fi, err := os.Stat(srv.Dir() + "/data")
	if err != nil {
		t.Fatal(err)
	}
	owner := fi.Sys().(*syscall.Stat_t).Uid
	if os.Geteuid() == 0 && owner == 0 {
		t.Fatal("run by root, the server's data directory belongs to root: the server must run unprivileged")
	}
	pool.Close()

	pid := srv.Pid()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if _, err := os.Stat(srv.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Stop, %s: %v; want it removed", srv.Dir(), err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("after Stop, postmaster %d: kill -0 = %v; want no such process", pid, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, srv.URL()); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("after Stop, the server still accepts connections")
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// The machine's own PostgreSQL, started as nobody when the test runs as root.
func TestStartMachineBinaries(t *testing.T) {
	t.Parallel()
	srv, err := embedpg.Start(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(srv.BinDir(), srv.Dir()) {
		t.Logf("no PostgreSQL installed: ran fetched binaries from %s", srv.BinDir())
	}
	exercise(t, srv)
}

// Binaries fetched from Maven Central (cached after the first run), as on
// a machine with no PostgreSQL installed.
func TestStartFetchedBinaries(t *testing.T) {
	t.Parallel()
	srv, err := embedpg.Start(context.Background(), &embedpg.Config{Fetch: true})
	if err != nil {
		if strings.Contains(err.Error(), "fetch") {
			testenv.Missing(t, "Maven Central, for PostgreSQL binaries: %v", err)
		}
		t.Fatal(err)
	}
	if !strings.HasPrefix(srv.BinDir(), srv.Dir()) {
		t.Fatalf("Fetch: true ran %s, not the fetched binaries", srv.BinDir())
	}
	exercise(t, srv)
}

// A cancelled start stops what it started and leaves no directory behind.
func TestStartCancelled(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // not parallel: the other tests wait until this one ends
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if srv, err := embedpg.Start(ctx, nil); err == nil {
		_ = srv.Stop()
		t.Fatal("Start with a cancelled context succeeded")
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("a cancelled Start left %s in the temporary directory", e.Name())
	}
}

// Config.Port puts the server on that port; a port that is not one is
// refused before anything starts.
func TestStartOnPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv, err := embedpg.Start(context.Background(), &embedpg.Config{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("@127.0.0.1:%d/", port); !strings.Contains(srv.URL(), want) {
		t.Fatalf("URL %s, want one on port %d", srv.URL(), port)
	}
	exercise(t, srv)

	if srv, err := embedpg.Start(context.Background(), &embedpg.Config{Port: 70000}); err == nil {
		_ = srv.Stop()
		t.Fatal("Start with Port 70000 succeeded")
	} else if !strings.Contains(err.Error(), "Config.Port") {
		t.Fatalf("error %q does not name Config.Port", err)
	}
}

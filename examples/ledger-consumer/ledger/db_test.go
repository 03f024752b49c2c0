package ledger

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/migrations"
)

// closedURL is a Postgres URL on a local port where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return "postgres://postgres:postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"
}

// With no URL given and nothing answering at the default, the demo gets a
// throwaway server: migrations and the ledger's tables work on it, and
// release stops it and removes its data directory.
func TestOpenDBStartsThrowawayServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var progress strings.Builder
	pool, release, err := openDB(ctx, closedURL(t), true, &progress, nil)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: "ledger_demo"}); err != nil {
		t.Fatal(err)
	}
	if err := Setup(ctx, pool, "ledger_demo"); err != nil {
		t.Fatal(err)
	}
	var dataDir string
	if err := pool.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	url := pool.Config().ConnString()
	release()
	released = true
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after release, the throwaway server's data directory %s: %v; want it removed", dataDir, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, url); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("after release, the throwaway server still accepts connections")
	}
	if !strings.Contains(progress.String(), "throwaway") {
		t.Fatalf("the demo did not say it started a throwaway server: %q", progress.String())
	}
}

// A URL the user gave that does not answer is an error, never replaced by
// a throwaway server.
func TestOpenDBGivenURLWins(t *testing.T) {
	t.Parallel()
	var progress strings.Builder
	pool, _, err := openDB(context.Background(), closedURL(t), false, &progress, nil)
	if err == nil {
		pool.Close()
		t.Fatal("an unreachable DATABASE_URL connected")
	}
	if !strings.Contains(err.Error(), "cannot reach Postgres") || progress.Len() > 0 {
		t.Fatalf("err = %v, progress %q; want the connect error and no throwaway server", err, progress.String())
	}
}

// A server that answers at the default URL is used as it is.
func TestOpenDBUsesAnsweringServer(t *testing.T) {
	t.Parallel()
	url, err := pgtest.URL()
	if err != nil {
		testenv.Missing(t, "Postgres: %v", err)
	}
	want, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	pool, release, err := openDB(context.Background(), url, true, &progress, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var port int
	var db string
	if err := pool.QueryRow(context.Background(), "SELECT current_setting('port')::int, current_database()").Scan(&port, &db); err != nil {
		t.Fatal(err)
	}
	if port != int(want.Port) || db != want.Database || progress.Len() > 0 {
		t.Fatalf("connected to port %d database %s (progress %q); want the answering server at %d/%s", port, db, progress.String(), want.Port, want.Database)
	}
}

// A password never reaches a message, whatever form the connection string
// has, a malformed one included: not the connect error, not the parse
// error, not the line that names the server.
func TestDatabaseMessagesHidePassword(t *testing.T) {
	t.Parallel()
	const pw = "s3cret-pw"
	u := closedURL(t)
	port, _, _ := strings.Cut(strings.TrimPrefix(u, "postgres://postgres:postgres@127.0.0.1:"), "/")
	for _, dsn := range []string{
		strings.Replace(u, "postgres:postgres@", "postgres:"+pw+"@", 1),
		u + "&password=" + pw,
		"host=127.0.0.1 port=" + port + " user=postgres password='" + pw + "' sslmode=disable",
		"postgres://postgres:" + pw + "@127.0.0.1:5x/postgres", // a bad port
		"postgres://postgres:" + pw + "%zz@127.0.0.1/postgres", // a bad escape
		"host=127.0.0.1 password=" + pw + " sslmode=bogus",     // an unknown sslmode
		"host=127.0.0.1 password = " + pw + " port=5x",         // spaces around =, a bad port
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		pool, _, err := openDB(ctx, dsn, false, nil, nil)
		cancel()
		if err == nil {
			pool.Close()
			t.Fatalf("%q connected to a closed port", dsn)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the error for %q carries the password: %v", dsn, err)
		}
		if _, err := newPool(context.Background(), dsn); err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("the parse error for %q carries the password: %v", dsn, err)
		}
		if s := where(dsn); strings.Contains(s, pw) {
			t.Errorf("where(%q) = %q carries the password", dsn, s)
		}
	}
}

package dbloss_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// pgBin holds the server binaries the clusters run with.
const pgBin = "/usr/lib/postgresql/15/bin"

// cluster is a PostgreSQL 15 cluster of the test's own: a data directory in
// a temporary directory, a port of its own, run as the postgres user so that
// it can be killed without touching the shared server.
type cluster struct {
	t    *testing.T
	name string
	dir  string
	port int
}

// requireClusters skips (fails under CI=true) when the test cannot run
// clusters of its own.
func requireClusters(t *testing.T) {
	t.Helper()
	for _, b := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(pgBin, b)); err != nil {
			testenv.Missing(t, "dbloss: %s not found in %s: the test runs PostgreSQL 15 clusters of its own (apt-get install postgresql-15)", b, pgBin)
		}
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "dbloss: the test runs its Postgres clusters as the postgres user and needs root for that (runuser)")
	}
	if _, err := user.Lookup("postgres"); err != nil {
		testenv.Missing(t, "dbloss: no postgres user to run a Postgres cluster as: %v", err)
	}
}

// baseDir returns a temporary directory the postgres user may enter.
func baseDir(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return base
}

// pgDir makes an empty directory owned by the postgres user.
func pgDir(t *testing.T, path string) string {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs a server binary as the postgres user.
func run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(pgBin, name)}, args...)...)
	return cmd.CombinedOutput()
}

// The clusters' ports: 55432 to 55439. A port another process holds (a
// server, or a client's ephemeral port) is passed over.
const firstPort, lastPort = 55432, 55439

var ports struct {
	sync.Mutex
	next int
}

// nextPort returns the next port of the range that nothing listens on.
func nextPort(t *testing.T) int {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	for range lastPort - firstPort + 1 {
		p := firstPort + ports.next
		ports.next = (ports.next + 1) % (lastPort - firstPort + 1)
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 200*time.Millisecond); err == nil {
			c.Close()
			continue
		}
		return p
	}
	t.Fatalf("dbloss: every port from %d to %d is taken", firstPort, lastPort)
	return 0
}

// newPrimary creates a cluster with initdb and starts it, ready to stream
// to standbys and to serve base backups.
func newPrimary(t *testing.T, base, name string) *cluster {
	t.Helper()
	c := &cluster{t: t, name: name, dir: pgDir(t, filepath.Join(base, name))}
	if out, err := run("initdb", "-D", c.dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatalf("dbloss: initdb %s: %v\n%s", name, err, out)
	}
	c.configure("wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\nmax_connections = 100\nshared_buffers = 32MB\nfsync = off\n" +
		"listen_addresses = '127.0.0.1'\n")
	c.start()
	return c
}

// configure appends settings to the cluster's postgresql.conf (a later
// line wins).
func (c *cluster) configure(settings string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + settings); err != nil {
		c.t.Fatal(err)
	}
}

// start starts the cluster on the next free port of the range, trying the
// one after when another process took it meanwhile.
func (c *cluster) start() {
	c.t.Helper()
	logPath := filepath.Join(c.dir, "server.log")
	for attempt := 0; ; attempt++ {
		c.port = nextPort(c.t)
		c.configure(fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n", c.port, c.dir))
		_ = os.Remove(logPath)
		out, err := run("pg_ctl", "-D", c.dir, "-l", logPath, "-w", "-t", "60", "start")
		if err == nil {
			break
		}
		log, _ := os.ReadFile(logPath)
		if strings.Contains(string(log), "Address already in use") && attempt < lastPort-firstPort {
			continue
		}
		c.t.Fatalf("dbloss: start %s: %v\n%s\n%s", c.name, err, out, log)
	}
	c.t.Cleanup(func() { _, _ = run("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop") })
}

// baseBackup copies c with pg_basebackup (WAL streamed alongside, a fast
// checkpoint) into a new cluster name; standby makes it an
// asynchronous streaming standby of c (-R). It is not started.
func (c *cluster) baseBackup(base, name string, standby bool) *cluster {
	c.t.Helper()
	b := &cluster{t: c.t, name: name, dir: pgDir(c.t, filepath.Join(base, name))}
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres", "-D", b.dir, "-X", "stream", "-c", "fast", "--no-sync"}
	if standby {
		args = append(args, "-R")
	}
	if out, err := run("pg_basebackup", args...); err != nil {
		c.t.Fatalf("dbloss: pg_basebackup of %s: %v\n%s", c.name, err, out)
	}
	_ = os.Remove(filepath.Join(b.dir, "postmaster.pid"))
	b.configure("hot_standby = on\n")
	return b
}

// promote ends a standby's recovery: it becomes a primary.
func (c *cluster) promote() {
	c.t.Helper()
	if out, err := run("pg_ctl", "-D", c.dir, "-w", "-t", "60", "promote"); err != nil {
		c.t.Fatalf("dbloss: promote %s: %v\n%s", c.name, err, out)
	}
}

// pids is the postmaster and every process it forked.
func (c *cluster) pids() []int {
	b, err := os.ReadFile(filepath.Join(c.dir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return nil
	}
	return append([]int{pm}, children(pm)...)
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces, so cut after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// kill9 kills the postmaster and every backend with SIGKILL: no shutdown
// checkpoint, no last WAL sent to anyone.
func (c *cluster) kill9() {
	for _, p := range c.pids() {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// stopWALSenders stops (SIGSTOP) c's WAL senders: its asynchronous
// standbys receive nothing more while c goes on committing, as a standby
// that fell behind (a slow network, a busy replica) does.
func (c *cluster) stopWALSenders() {
	c.t.Helper()
	n := 0
	for _, p := range c.pids() {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err == nil && strings.Contains(string(cmd), "walsender") {
			if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
				c.t.Fatal(err)
			}
			n++
		}
	}
	if n == 0 {
		c.t.Fatalf("dbloss: %s has no WAL sender to stop", c.name)
	}
}

// pool connects to c's postgres database.
func (c *cluster) pool(app string) *pgxpool.Pool {
	c.t.Helper()
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&application_name=%s", c.port, app))
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.MaxConns = 12
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(p.Close)
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

// Package pgcluster runs PostgreSQL clusters of a system test's own: initdb
// in a temporary directory, a port of their own, run as the postgres user
// (through runuser, so the test runs as root) so that a test can crash,
// pause, back up and promote them without touching the shared server.
package pgcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// Cluster is one PostgreSQL cluster: its data directory, the directory of
// its Unix socket and its port (0 until the first Start).
type Cluster struct {
	Name string // in messages
	Bin  string // the server binaries (initdb, pg_ctl, pg_basebackup)
	Dir  string // the data directory, owned by the postgres user
	Sock string // the Unix socket's directory
	Port int
}

// NewestBin returns the directory of the newest PostgreSQL server binaries
// of the machine (/usr/lib/postgresql/*/bin, else initdb's directory on
// $PATH), or "" when there are none.
func NewestBin() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

// Require skips t (fails it under CI=true) when it cannot run clusters with
// the binaries in bin: binaries missing, not root, no postgres user. suite
// prefixes the messages.
func Require(t testing.TB, suite, bin string) {
	t.Helper()
	for _, b := range []string{"initdb", "pg_ctl", "pg_basebackup"} {
		if _, err := os.Stat(filepath.Join(bin, b)); bin == "" || err != nil {
			testenv.Missing(t, "%s: PostgreSQL's %s not found in %q: the test runs PostgreSQL clusters of its own (apt-get install postgresql)", suite, b, bin)
		}
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "%s: the test runs its Postgres clusters as the postgres user and needs root for that (runuser)", suite)
	}
	if _, err := user.Lookup("postgres"); err != nil {
		testenv.Missing(t, "%s: no postgres user to run a Postgres cluster as: %v", suite, err)
	}
}

// BaseDir returns a temporary directory of t that the postgres user may
// enter.
func BaseDir(t testing.TB) string {
	t.Helper()
	base := t.TempDir()
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return base
}

// New describes a cluster in base/name, with no data yet (Init or Backup
// makes it); t's cleanup stops it.
func New(t testing.TB, bin, base, name string) *Cluster {
	c := &Cluster{Name: name, Bin: bin, Dir: filepath.Join(base, name), Sock: filepath.Join(base, name+".sock")}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// Init creates a cluster with initdb in base/name, listening on 127.0.0.1
// with trust authentication and settings appended to its
// postgresql.conf. It is not started.
func Init(t testing.TB, bin, base, name, settings string) *Cluster {
	t.Helper()
	c := New(t, bin, base, name)
	if err := pgDir(c.Dir); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Run("initdb", "-D", c.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatalf("pgcluster: initdb %s: %v\n%s", name, err, out)
	}
	if err := c.Configure("listen_addresses = '127.0.0.1'\n" + settings); err != nil {
		t.Fatal(err)
	}
	return c
}

// pgDir makes path an empty directory owned by the postgres user.
func pgDir(path string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	return os.Chown(path, uid, gid)
}

// Run runs a server binary as the postgres user.
func (c *Cluster) Run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(c.Bin, name)}, args...)...)
	return cmd.CombinedOutput()
}

// Configure appends settings to the cluster's postgresql.conf (a later
// line wins).
func (c *Cluster) Configure(settings string) error {
	f, err := os.OpenFile(filepath.Join(c.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString("\n" + settings)
	return err
}

// URL is the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Start starts the server and waits until it accepts connections. The
// first start takes a free port, and another one when a process took it
// meanwhile; later starts keep it.
func (c *Cluster) Start() error {
	logPath := filepath.Join(c.Dir, "server.log")
	for attempt := 0; ; attempt++ {
		fresh := c.Port == 0 || attempt > 0
		if fresh {
			port, err := FreePort()
			if err != nil {
				return err
			}
			c.Port = port
		}
		if err := pgDir(c.Sock); err != nil {
			return err
		}
		if err := c.Configure(fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n", c.Port, c.Sock)); err != nil {
			return err
		}
		_ = os.Remove(logPath)
		out, err := c.Run("pg_ctl", "-D", c.Dir, "-l", logPath, "-w", "-t", "120", "start")
		if err == nil {
			return nil
		}
		log, _ := os.ReadFile(logPath)
		if !fresh || attempt >= 8 || !strings.Contains(string(log), "Address already in use") {
			return fmt.Errorf("pgcluster: start %s on port %d: %v\n%s\n%s", c.Name, c.Port, err, out, log)
		}
	}
}

// Stop stops the server at once (pg_ctl stop -m immediate: no checkpoint,
// crash recovery at the next start).
func (c *Cluster) Stop() error {
	if out, err := c.Run("pg_ctl", "-D", c.Dir, "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pgcluster: stop %s: %v\n%s", c.Name, err, out)
	}
	return nil
}

// RestartImmediate crashes the server (Stop) and starts it again.
func (c *Cluster) RestartImmediate() error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start()
}

// Backup makes dst a copy of c by pg_basebackup (WAL streamed alongside, a
// fast checkpoint), its data directory replaced; standby makes it an
// asynchronous streaming standby of c (-R, hot_standby on). dst is not
// started.
func (c *Cluster) Backup(dst *Cluster, standby bool) error {
	if err := pgDir(dst.Dir); err != nil {
		return err
	}
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres", "-D", dst.Dir, "-X", "stream", "-c", "fast", "--no-sync"}
	if standby {
		args = append(args, "-R")
	}
	if out, err := dst.Run("pg_basebackup", args...); err != nil {
		return fmt.Errorf("pgcluster: pg_basebackup of %s (port %d): %v\n%s", c.Name, c.Port, err, out)
	}
	_ = os.Remove(filepath.Join(dst.Dir, "postmaster.pid"))
	return dst.Configure("hot_standby = on\n")
}

// Promote ends a standby's recovery: it becomes a primary.
func (c *Cluster) Promote() error {
	if out, err := c.Run("pg_ctl", "-D", c.Dir, "-w", "-t", "120", "promote"); err != nil {
		return fmt.Errorf("pgcluster: promote %s: %v\n%s", c.Name, err, out)
	}
	return nil
}

// Reload makes the server read its configuration again.
func (c *Cluster) Reload() error {
	if out, err := c.Run("pg_ctl", "-D", c.Dir, "reload"); err != nil {
		return fmt.Errorf("pgcluster: reload %s: %v\n%s", c.Name, err, out)
	}
	return nil
}

// Pids is the postmaster and every process it forked.
func (c *Cluster) Pids() []int {
	b, err := os.ReadFile(filepath.Join(c.Dir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return nil
	}
	return append([]int{pm}, children(pm)...)
}

// Kill9 kills the postmaster and every backend with SIGKILL (no shutdown
// checkpoint, no last WAL sent to anyone) and waits for them to be gone.
func (c *Cluster) Kill9() error {
	ps := c.Pids()
	for _, pid := range ps {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		alive := slices.ContainsFunc(ps, func(pid int) bool { return syscall.Kill(pid, 0) == nil && !zombie(pid) })
		if !alive && !portOpen(c.Port) {
			// A server killed this way leaves its socket and the socket's
			// lock file, which a new one on the port refuses to take over.
			sock := filepath.Join(c.Sock, fmt.Sprintf(".s.PGSQL.%d", c.Port))
			_ = os.Remove(sock + ".lock")
			_ = os.Remove(sock)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: the Postgres on port %d still runs 30s after SIGKILL", c.Port)
		}
		time.Sleep(50 * time.Millisecond) // poll: the kernel reaps them
	}
}

// Pause stops every process of the cluster for d, then resumes them.
func (c *Cluster) Pause(d time.Duration) {
	ps := c.Pids()
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGSTOP)
	}
	time.Sleep(d) // the fault itself: the server is frozen this long
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGCONT)
	}
}

// StopWALSenders stops (SIGSTOP) the cluster's WAL senders: its
// asynchronous standbys receive nothing more while it goes on committing,
// as a standby that fell behind (a slow network, a busy replica) does.
func (c *Cluster) StopWALSenders() error {
	n := 0
	for _, p := range c.Pids() {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err == nil && strings.Contains(string(cmd), "walsender") {
			if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
				return err
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("pgcluster: %s has no WAL sender to stop", c.Name)
	}
	return nil
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

// zombie reports whether pid has exited and waits for its parent.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

func portOpen(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// FreePort returns a loopback port nothing listens on right now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

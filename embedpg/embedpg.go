// Package embedpg runs a throwaway PostgreSQL server in a temporary
// directory for as long as a program needs one, and removes it afterwards.
//
// It runs the machine's own PostgreSQL binaries when there are some, and
// otherwise binaries fetched once from Maven Central (the
// io.zonky.test.postgres builds that embedded-postgres libraries use) and
// cached under the user's cache directory. PostgreSQL refuses to run as root:
// started by root, the server runs as the unprivileged user nobody.
//
//	srv, err := embedpg.Start(ctx, nil)
//	if err != nil { … }
//	defer srv.Stop()
//	pool, err := pgxpool.New(ctx, srv.URL())
//
// The server listens on 127.0.0.1 only, on a free port, with a random
// password, and keeps no data: fsync is off and Stop deletes the directory.
// If the program dies without calling Stop, the kernel stops the server (it
// gets SIGQUIT when its parent exits); its directory is left in the
// temporary directory.
package embedpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultVersion is the PostgreSQL release fetched when the machine has
// none: the major version CI runs.
const DefaultVersion = "15.19.0"

// DefaultRepository is the Maven repository the binaries come from.
const DefaultRepository = "https://repo1.maven.org/maven2"

// Config configures Start. A nil *Config is the zero Config.
type Config struct {
	// BinDir holds the postgres and initdb executables. Defaults to the
	// machine's PostgreSQL (pg_config --bindir, the newest
	// /usr/lib/postgresql/N/bin, or postgres on PATH), else binaries
	// fetched from Repository.
	BinDir string
	// Fetch uses fetched binaries even when the machine has its own.
	// Defaults to false.
	Fetch bool
	// Version of the fetched binaries. Defaults to DefaultVersion.
	Version string
	// Repository is the Maven repository to fetch from. Defaults to
	// DefaultRepository.
	Repository string
	// CacheDir keeps fetched binaries between runs. Defaults to
	// os.UserCacheDir()/exactly.
	CacheDir string
	// Port the server listens on (on 127.0.0.1). Defaults to a free port.
	Port int
	// StartTimeout bounds initdb and the server's start. Defaults to 2 minutes.
	StartTimeout time.Duration
	// Logger reports what is fetched and started. Defaults to discarding.
	Logger *slog.Logger
}

// Server is a running PostgreSQL server. Stop it to remove it.
type Server struct {
	url     string
	dir     string
	bin     string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	once    sync.Once
	stopErr error
}

// URL is the server's connection URL (database postgres, user postgres).
func (s *Server) URL() string { return s.url }

// Dir is the temporary directory that holds the server's data, socket and
// log (postgres.log); Stop removes it.
func (s *Server) Dir() string { return s.dir }

// BinDir is where the running postgres executable came from.
func (s *Server) BinDir() string { return s.bin }

// Pid is the server's (postmaster's) process ID.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Start initialises a cluster in a new temporary directory and starts a
// server on it. The server is up and accepts connections at URL when Start
// returns. If ctx ends before that, Start stops what it started and removes
// the directory.
func Start(ctx context.Context, cfg *Config) (*Server, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Version == "" {
		c.Version = DefaultVersion
	}
	if c.Repository == "" {
		c.Repository = DefaultRepository
	}
	if c.CacheDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("embedpg: no cache directory (set Config.CacheDir or HOME): %w", err)
		}
		c.CacheDir = filepath.Join(d, "exactly")
	}
	if c.Port < 0 || c.Port > 65535 {
		return nil, fmt.Errorf("embedpg: Config.Port %d is not a TCP port: set one in 1-65535, or 0 for a free one", c.Port)
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(ctx, c.StartTimeout)
	defer cancel()

	owner, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "exactly-postgres-")
	if err != nil {
		return nil, fmt.Errorf("embedpg: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	bin := c.BinDir
	if bin == "" && !c.Fetch {
		bin = machineBinDir()
	}
	if bin == "" {
		tarball, err := fetch(ctx, &c)
		if err != nil {
			return nil, err
		}
		// Unpacked into the run's directory: with the server running as
		// nobody, the binaries must be where nobody can read them, which a
		// cache under root's home is not.
		if err := untar(tarball, filepath.Join(dir, "pgsql")); err != nil {
			return nil, err
		}
		bin = filepath.Join(dir, "pgsql", "bin")
	}
	for _, exe := range []string{"postgres", "initdb"} {
		if _, err := os.Stat(filepath.Join(bin, exe)); err != nil {
			return nil, fmt.Errorf("embedpg: no %s in %s: set Config.BinDir to a PostgreSQL bin directory, or Config.Fetch: %w", exe, bin, err)
		}
	}
	password := make([]byte, 12)
	_, _ = rand.Read(password)
	pw := hex.EncodeToString(password)
	if err := os.WriteFile(filepath.Join(dir, "pwfile"), []byte(pw+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("embedpg: %w", err)
	}
	if owner != nil {
		if err := chownTree(dir, owner); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--pwfile", filepath.Join(dir, "pwfile"), "-A", "scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = procAttr(owner, false)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("embedpg: initdb: %w\n%s", ctxErr(ctx, err), tail(out))
	}
	c.Logger.Info("embedpg: initialised a cluster", "dir", dir, "bin", bin)

	// A free port can be taken between choosing it and the server binding
	// it: try again on another.
	var srv *Server
	for attempt := 1; ; attempt++ {
		srv, err = launch(ctx, dir, bin, owner, pw, c.Port)
		if err == nil || attempt == 3 || ctx.Err() != nil || c.Port != 0 || !strings.Contains(err.Error(), "could not bind") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	ok = true
	c.Logger.Info("embedpg: server up", "dir", dir, "pid", srv.Pid())
	return srv, nil
}

func launch(ctx context.Context, dir, bin string, owner *credential, pw string, port int) (*Server, error) {
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(dir, "postgres.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embedpg: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	// In its own process group (a Ctrl-C in the terminal reaches the
	// program, which stops the server in order), stopped by the kernel if
	// the program dies.
	cmd.SysProcAttr = procAttr(owner, true)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("embedpg: start postgres: %w", err)
	}
	s := &Server{
		url:    fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", pw, port),
		dir:    dir,
		bin:    bin,
		cmd:    cmd,
		exited: make(chan struct{}),
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(pctx, s.url)
		if err == nil {
			err = conn.Ping(pctx)
			_ = conn.Close(pctx)
		}
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("embedpg: postgres exited before it accepted connections: %v\n%s", s.waitErr, tail(out))
		case <-ctx.Done():
			_ = s.kill()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("embedpg: postgres did not accept connections: %w (last error: %v)\n%s", ctx.Err(), err, tail(out))
		case <-tick.C:
		}
	}
}

// kill ends the server's whole process group and waits for the postmaster.
func (s *Server) kill() error {
	err := killGroup(s.cmd.Process)
	<-s.exited
	return err
}

// Stop shuts the server down (a fast shutdown: sessions are disconnected)
// and removes its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	s.once.Do(func() {
		err := interrupt(s.cmd.Process)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			err = errors.Join(fmt.Errorf("embedpg: postgres did not stop within 30s; killed"), s.kill())
		}
		if err != nil && errors.Is(err, os.ErrProcessDone) {
			err = nil
		}
		s.stopErr = errors.Join(err, os.RemoveAll(s.dir))
	})
	return s.stopErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedpg: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// tail keeps the last lines of a log for an error message.
func tail(b []byte) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

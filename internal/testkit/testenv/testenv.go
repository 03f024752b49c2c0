// Package testenv finds the services that tests need and holds the small
// helpers that every integration test uses.
//
// Services are found in this order: environment variables, testcontainers-go
// when a Docker engine answers, services started from local installs, then
// (Kafka only) an in-process broker. A test whose service is missing is
// skipped with a message naming it; with CI=true it fails instead.
//
// The containers come from internal/testkit/testservices, a command in a module of
// its own, run by Container as a helper process for the test process's
// lifetime: testcontainers-go and the Docker client are requirements of that
// module, not of the library's go.mod.
//
// Each test logs where its services came from, and with
// EXACTLY_REQUIRE_SOURCE set (testcontainers, env, local, in-process) a
// service from any other source fails the test: `make test-docker` runs the
// suite so, with every service from testcontainers.
//
// Containers run on the host's network and listen on 127.0.0.1 only, at
// ports the kit picks free and passes in: no connection goes to an address
// of a Docker bridge, and nothing collides with servers already running on
// the usual ports.
package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/backoff"
)

// Source says where a service came from.
type Source string

const (
	SourceEnv       Source = "env"
	SourceContainer Source = "testcontainers"
	SourceLocal     Source = "local"
	SourceInProcess Source = "in-process"
)

// RequireSourceEnv names the variable that makes every service of the run
// come from one source.
const RequireSourceEnv = "EXACTLY_REQUIRE_SOURCE"

// RequiredSource returns the source EXACTLY_REQUIRE_SOURCE names ("" when unset).
func RequiredSource() Source { return Source(os.Getenv(RequireSourceEnv)) }

var reported sync.Map // "service\x00test name" -> struct{}

// Report logs, once per test, where service came from (where is its address
// and, when it is not the first choice, why the others were passed over);
// it fails t when EXACTLY_REQUIRE_SOURCE names another source.
func Report(t testing.TB, service string, src Source, where string) {
	t.Helper()
	if _, dup := reported.LoadOrStore(service+"\x00"+t.Name(), struct{}{}); !dup {
		t.Logf("%s from %s: %s", service, src, where)
	}
	if want := RequiredSource(); want != "" && want != src {
		t.Fatalf("%s=%s but %s came from %s: %s", RequireSourceEnv, want, service, src, where)
	}
}

// ContainerLabel marks the containers the kit starts, so that a run with
// the Ryuk reaper disabled can remove them afterwards
// (docker rm -f $(docker ps -aq --filter label=dev.exactly.testenv)). Its
// value is $EXACTLY_TESTENV_RUN when set (scripts/test-docker.sh sets it, to
// remove its own containers only), else the test process's pid.
const ContainerLabel = "dev.exactly.testenv"

// FreePorts returns n distinct TCP ports that are free on 127.0.0.1 now, for
// a container on the host network to listen on.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testenv: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// CI reports whether tests run in CI (CI=true): there a missing service is a
// failure, not a skip.
func CI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Missing skips t, or fails it under CI, because a service is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("CI=true and %s", msg)
	}
	t.Skip(msg)
}

// HelperEnv names the variable that points to a built
// internal/testkit/testservices binary (scripts/test-docker.sh builds it once for
// the whole run); without it, the kit builds one with the go command.
const HelperEnv = "EXACTLY_TESTSERVICES"

// DockerAvailable reports whether a Docker engine may answer: DOCKER_HOST
// is set, or a Docker socket is where testcontainers looks for one. The
// helper (Container) asks the engine itself.
func DockerAvailable() (ok bool, reason error) {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return true, nil
	}
	socks := []string{"/var/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		socks = append(socks, filepath.Join(d, "docker.sock"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		socks = append(socks, filepath.Join(h, ".docker", "run", "docker.sock"),
			filepath.Join(h, ".docker", "desktop", "docker.sock"))
	}
	for _, s := range socks {
		if c, err := net.DialTimeout("unix", s, 2*time.Second); err == nil {
			_ = c.Close()
			return true, nil
		}
	}
	return false, fmt.Errorf("DOCKER_HOST is unset and nothing answers at %s", strings.Join(socks, ", "))
}

// helper is this process's internal/testkit/testservices process. Its standard
// input stays open as long as this process lives: when it closes, the helper
// removes the containers it started.
var helper struct {
	mu    sync.Mutex
	start sync.Once
	err   error
	in    io.WriteCloser
	out   *bufio.Reader
	log   *tail
}

// startHelper starts the helper: $EXACTLY_TESTSERVICES, else one built with
// the go command from the sources next to this package (and removed once it
// runs).
func startHelper() error {
	helper.start.Do(func() {
		bin := os.Getenv(HelperEnv)
		if bin == "" {
			_, file, _, ok := runtime.Caller(0)
			if !ok || !filepath.IsAbs(file) {
				helper.err = errors.New("the sources of internal/testkit/testservices are not at hand (set " + HelperEnv + ")")
				return
			}
			dir, err := os.MkdirTemp("", "exactly-testservices-")
			if err != nil {
				helper.err = err
				return
			}
			defer os.RemoveAll(dir)
			bin = filepath.Join(dir, "testservices")
			// go test puts its own GOROOT/bin first on the PATH.
			cmd := exec.Command("go", "build", "-o", bin, ".")
			cmd.Dir = filepath.Join(filepath.Dir(file), "..", "testservices")
			if out, err := cmd.CombinedOutput(); err != nil {
				helper.err = fmt.Errorf("go build internal/testkit/testservices: %v: %s", err, bytes.TrimSpace(out))
				return
			}
		}
		cmd := exec.Command(bin)
		in, err := cmd.StdinPipe()
		if err != nil {
			helper.err = err
			return
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			helper.err = err
			return
		}
		helper.log = &tail{max: 8 << 10}
		cmd.Stderr = helper.log
		if err := cmd.Start(); err != nil {
			helper.err = fmt.Errorf("start %s: %w", bin, err)
			return
		}
		helper.in, helper.out = in, bufio.NewReader(out)
	})
	return helper.err
}

// Container starts service ("postgres" or "kafka") in a container through
// the internal/testkit/testservices helper and returns its address (a Postgres URL,
// or a broker's host:port) and a description of where it runs. The
// container lives as long as this process.
func Container(service string) (addr, where string, err error) {
	if err := startHelper(); err != nil {
		return "", "", err
	}
	helper.mu.Lock()
	defer helper.mu.Unlock()
	if _, err := io.WriteString(helper.in, service+"\n"); err != nil {
		return "", "", fmt.Errorf("testservices: %v: %s", err, helper.log.String())
	}
	line, err := helper.out.ReadBytes('\n')
	var ans struct{ Addr, Where, Error string }
	if err == nil {
		err = json.Unmarshal(line, &ans)
	}
	if err != nil {
		return "", "", fmt.Errorf("testservices %s: %v: %s", service, err, helper.log.String())
	}
	if ans.Error != "" {
		return "", "", errors.New(ans.Error)
	}
	return ans.Addr, ans.Where, nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// WaitFor polls cond every few milliseconds until it holds, failing t after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for delay := backoff.New(5*time.Millisecond, 200*time.Millisecond); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", d, what)
		}
		time.Sleep(delay.Next())
	}
}

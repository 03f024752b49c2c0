// Package testenv finds the services that tests need and holds the small
// helpers that every integration test uses.
//
// Services are found in this order: environment variables, testcontainers-go
// when a Docker engine answers, services started from local installs, then
// (Kafka only) an in-process broker. A test whose service is missing is
// skipped with a message naming it; with CI=true it fails instead.
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
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/testcontainers/testcontainers-go"
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

func runLabel() string {
	if v := os.Getenv("EXACTLY_TESTENV_RUN"); v != "" {
		return v
	}
	return strconv.Itoa(os.Getpid())
}

// Loopback is the testcontainers option every container of the kit takes:
// host networking (no port is published and nothing connects to a bridge
// address; the service must be told which 127.0.0.1 port to listen on) and
// the kit's label.
func Loopback() testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		req.ExposedPorts = nil
		req.Networks = nil
		req.NetworkAliases = nil
		prev := req.HostConfigModifier
		req.HostConfigModifier = func(hc *container.HostConfig) {
			if prev != nil {
				prev(hc)
			}
			hc.NetworkMode = "host"
			hc.PortBindings = nil
			hc.PublishAllPorts = false
		}
		// testcontainers attaches every container to its default network
		// (creating a bridge when the engine has none): detach it.
		prevEndpoints := req.EndpointSettingsModifier
		req.EndpointSettingsModifier = func(es map[string]*network.EndpointSettings) {
			if prevEndpoints != nil {
				prevEndpoints(es)
			}
			clear(es)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[ContainerLabel] = runLabel()
		return nil
	}
}

// Shared makes the test processes of one run (EXACTLY_TESTENV_RUN set) share
// one container of service, found by name, instead of one per package: the
// tests isolate themselves (a schema, topics and groups of their own), and a
// broker's start-up costs a minute on a loaded machine. The first process
// creates it; the others reuse it and read its ports from its environment
// (ContainerEnv). Without EXACTLY_TESTENV_RUN, each process has its own.
func Shared(service string) testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		if run := os.Getenv("EXACTLY_TESTENV_RUN"); run != "" {
			return testcontainers.WithReuseByName("exactly-" + run + "-" + service)(req)
		}
		return nil
	}
}

// ContainerEnv returns the value of the environment variable key in c's
// configuration.
func ContainerEnv(ctx context.Context, c testcontainers.Container, key string) (string, error) {
	in, err := c.Inspect(ctx)
	if err != nil {
		return "", fmt.Errorf("testenv: inspect container: %w", err)
	}
	for _, kv := range in.Config.Env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("testenv: container %s has no %s", c.GetContainerID(), key)
}

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

var docker struct {
	once sync.Once
	ok   bool
	err  error
}

// DockerAvailable reports whether a Docker engine answers, so testcontainers
// can run. The answer is cached for the process.
func DockerAvailable() (ok bool, reason error) {
	docker.once.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				docker.err = fmt.Errorf("docker: %v", r)
			}
		}()
		p, err := testcontainers.ProviderDefault.GetProvider()
		if err != nil {
			docker.err = err
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Health(ctx); err != nil {
			docker.err = err
			return
		}
		docker.ok = true
	})
	return docker.ok, docker.err
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

// Package testenv finds the services that tests need and holds the small
// helpers that every integration test uses.
//
// Services are found in this order: environment variables, testcontainers-go
// when a Docker engine answers, services started from local installs, then
// (Kafka only) an in-process broker. A test whose service is missing is
// skipped with a message naming it; with CI=true it fails instead.
package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

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
	for delay := 5 * time.Millisecond; !cond(); delay = min(2*delay, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", d, what)
		}
		time.Sleep(delay)
	}
}

package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records what Report does with it.
type recorder struct {
	testing.TB
	name         string
	logs, fatals []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatals = append(r.fatals, fmt.Sprintf(format, args...))
}

func TestReportFailsOnAnotherSourceThanRequired(t *testing.T) {
	t.Setenv(RequireSourceEnv, string(SourceContainer))
	for _, src := range []Source{SourceEnv, SourceLocal, SourceInProcess} {
		r := &recorder{name: t.Name() + "/" + string(src)}
		Report(r, "Kafka", src, "127.0.0.1:9092")
		if len(r.fatals) != 1 {
			t.Errorf("source %s with %s=%s: fatals %q, want one", src, RequireSourceEnv, SourceContainer, r.fatals)
		}
	}
	r := &recorder{name: t.Name() + "/container"}
	Report(r, "Kafka", SourceContainer, "127.0.0.1:40000")
	if len(r.fatals) != 0 {
		t.Errorf("the required source failed the test: %q", r.fatals)
	}
}

func TestReportAcceptsAnySourceWhenNoneIsRequired(t *testing.T) {
	t.Setenv(RequireSourceEnv, "")
	r := &recorder{name: t.Name()}
	Report(r, "Postgres", SourceLocal, "localhost:5432")
	Report(r, "Postgres", SourceLocal, "localhost:5432")
	if len(r.fatals) != 0 {
		t.Errorf("fatals %q, want none", r.fatals)
	}
	if len(r.logs) != 1 || r.logs[0] != "Postgres from local: localhost:5432" {
		t.Errorf("logs %q, want the source logged once", r.logs)
	}
}

// TestContainerAsksTheHelper: the kit builds internal/testservices, starts
// it and reads its answers; a service it does not know is an error that
// names it (no Docker engine needed).
func TestContainerAsksTheHelper(t *testing.T) {
	if testing.Short() {
		t.Skip("builds internal/testservices")
	}
	_, _, err := Container("no-such-service")
	if err == nil || !strings.Contains(err.Error(), `unknown service "no-such-service"`) {
		t.Fatalf("Container(no-such-service): %v, want an unknown-service error", err)
	}
}

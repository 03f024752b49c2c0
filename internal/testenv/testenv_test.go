package testenv

import (
	"fmt"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
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

// TestLoopbackRunsOnTheHostNetworkOnly: whatever a module or the image
// asks for (exposed ports, networks, testcontainers' default bridge), the
// container is created on the host network with no port published and no
// network endpoint.
func TestLoopbackRunsOnTheHostNetworkOnly(t *testing.T) {
	req := testcontainers.GenericContainerRequest{ContainerRequest: testcontainers.ContainerRequest{
		ExposedPorts: []string{"5432/tcp"},
		Networks:     []string{"mynet"},
	}}
	for _, opt := range []testcontainers.ContainerCustomizer{
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.Privileged = true }),
		Loopback(),
	} {
		if err := opt.Customize(&req); err != nil {
			t.Fatal(err)
		}
	}
	hc := &container.HostConfig{PublishAllPorts: true, PortBindings: nat.PortMap{"5432/tcp": {{HostPort: "5432"}}}}
	req.HostConfigModifier(hc)
	if hc.NetworkMode != "host" || len(hc.PortBindings) != 0 || hc.PublishAllPorts {
		t.Errorf("host config: network %q, bindings %v, publish all %v; want host, none, false", hc.NetworkMode, hc.PortBindings, hc.PublishAllPorts)
	}
	if !hc.Privileged {
		t.Error("an earlier host config modifier was dropped")
	}
	es := map[string]*network.EndpointSettings{"reaper_default": {}}
	req.EndpointSettingsModifier(es)
	if len(es) != 0 {
		t.Errorf("endpoints %v, want none", es)
	}
	if len(req.ExposedPorts) != 0 || len(req.Networks) != 0 {
		t.Errorf("exposed ports %v, networks %v; want none", req.ExposedPorts, req.Networks)
	}
	if req.Labels[ContainerLabel] == "" {
		t.Errorf("labels %v: no %s", req.Labels, ContainerLabel)
	}
}

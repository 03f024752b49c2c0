package main

import (
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

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
	if req.Labels[testenv.ContainerLabel] == "" {
		t.Errorf("labels %v: no %s", req.Labels, testenv.ContainerLabel)
	}
}

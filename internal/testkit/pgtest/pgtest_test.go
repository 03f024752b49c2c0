package pgtest_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// TestContainerListensOnLoopbackOnly: a Postgres from testcontainers runs on
// the host network and listens on 127.0.0.1 only, at a port of its own (not
// the 5432 of a server the machine may already run).
func TestContainerListensOnLoopbackOnly(t *testing.T) {
	db := pgtest.NewEmpty(t)
	if src, where := pgtest.Source(); src != testenv.SourceContainer {
		t.Skipf("Postgres from %s (%s), not from testcontainers", src, where)
	}
	var listen, addr string
	var port int
	err := db.Pool.QueryRow(context.Background(),
		"SELECT current_setting('listen_addresses'), host(inet_server_addr()), inet_server_port()").Scan(&listen, &addr, &port)
	if err != nil {
		t.Fatal(err)
	}
	if listen != "127.0.0.1" || addr != "127.0.0.1" || port == 5432 {
		t.Fatalf("listen_addresses %q, connected to %s:%d; want 127.0.0.1 only, not port 5432", listen, addr, port)
	}
}

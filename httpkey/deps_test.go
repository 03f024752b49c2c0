package httpkey_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayering keeps the HTTP middleware free of the Kafka side: a user of
// the middleware and the outbox compiles no Kafka client, no consumer and
// no worker; and it reaches its keys through its Store interface, not
// pgstore, so that a handler behind it can be tested on a store in memory.
func TestLayering(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	banned := []string{"github.com/segmentio/kafka-go", "github.com/exactly-go/exactly/kafkapubsub",
		"github.com/exactly-go/exactly/worker", "github.com/exactly-go/exactly/consumer",
		"github.com/exactly-go/exactly/pgstore"}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages: %q", len(deps), out)
	}
	for _, dep := range deps {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("httpkey depends on %s", dep)
			}
		}
	}
}

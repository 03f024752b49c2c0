package retry_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandardLibraryOnly: a client of an idempotent API compiles the
// standard library and the module's one back-off, nothing else (no pgx,
// no Watermill, not the server's httpkey).
func TestStandardLibraryOnly(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/exactly-go/exactly/httpkey/retry":    true,
		"github.com/exactly-go/exactly/internal/backoff": true,
		"github.com/exactly-go/exactly/internal/clock":   true,
	}
	for _, dep := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(dep, "/")
		if strings.Contains(first, ".") && !allowed[dep] {
			t.Errorf("retry depends on %s", dep)
		}
	}
}

package workertest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/worker"
	"github.com/exactly-go/exactly/worker/workertest"
)

// README.md's "Testing a worker" snippet, as it is there (TestReadmeSnippet
// checks), run.
func TestReadme(t *testing.T) {
	t.Parallel()
	k := workertest.New(t, &workertest.Config{Setup: []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"}})
	k.Start(&worker.Config{Scope: "top-ups", Handler: topUp})
	a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
	k.Send(a, a) // an exact duplicate
	k.Replay()   // a new group consumes the whole topic again
	k.AssertRows("SELECT id, balance FROM accounts", "acc-1 10")
	k.AssertOutputs("topped-up-cmd-1")
}

// README.md shows TestReadme's body, after its t.Parallel, as it is.
func TestReadmeSnippet(t *testing.T) {
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(src), "func TestReadme(t *testing.T) {\n\tt.Parallel()\n")
	body, _, _ = strings.Cut(body, "\n}\n")
	want := "```go\n" + strings.ReplaceAll(strings.TrimPrefix(body, "\t"), "\n\t", "\n") + "\n```\n"
	_, section, _ := strings.Cut(string(readme), "\n## Testing a worker\n")
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, want) {
		t.Errorf("README.md's Testing a worker section does not show\n%s", want)
	}
}

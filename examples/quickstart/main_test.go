package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/worker"
	"github.com/exactly-go/exactly/worker/workertest"
)

func TestMain(m *testing.M) { workertest.Main(m) }

// The quick start's handler on a worker, as a user tests theirs: an exact
// duplicate, a redelivery, a malformed command and a replay of the topic;
// each command applied once.
func TestTopUp(t *testing.T) {
	t.Parallel()
	k := workertest.New(t, &workertest.Config{
		Setup: []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"},
	})
	k.Start(&worker.Config{Scope: "top-ups", Handler: topUp})
	a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
	b := workertest.Command{ID: "cmd-2", Payload: `{"account":"acc-2","amount":20}`}
	c := workertest.Command{ID: "cmd-3", Payload: `{"account":"acc-1","amount":5}`}
	k.Send(a, b, c, a, workertest.Command{ID: "cmd-4", Payload: `{"amount":`})
	k.Redeliver("cmd-2")
	k.Replay()
	k.AssertRows("SELECT id, balance FROM accounts ORDER BY id", "acc-1 15", "acc-2 20")
	k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2", "topped-up-cmd-3")
	k.AssertDeadLetters("cmd-4", "cmd-4")
}

// The quick start builds and runs as a worker until it is interrupted: it
// creates its tables, applies each command once, emits one event per
// command through the outbox (all of them published before it exits) and
// dead-letters the malformed one; run again on the same commands sent
// again, it applies nothing.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	prefix := "quickstart-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + time.Now().Format("150405.000000")
	k := workertest.New(t, &workertest.Config{Topic: prefix + ".commands", OutputTopic: prefix + ".events",
		DeadLetterTopic: prefix + ".commands.dlq", Group: "top-ups"}) // the quick start's defaults: its Scope is its group
	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var output strings.Builder
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the quick start's output:\n%s", output.String())
		}
	})
	k.Run(func(ctx context.Context, _ string) error {
		cmd := exec.CommandContext(ctx, bin, "-db", k.DatabaseURL(), "-brokers", strings.Join(k.Brokers(), ","), "-prefix", prefix)
		cmd.Stdout, cmd.Stderr = &output, &output
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // as a terminal's Ctrl-C
		cmd.WaitDelay = time.Minute
		if err := cmd.Run(); err != nil && !(errors.Is(err, context.Canceled) && cmd.ProcessState.Success()) {
			return err
		}
		return nil
	})
	k.Send(workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`},
		workertest.Command{ID: "cmd-2", Payload: `{"account":"acc-2","amount":20}`},
		workertest.Command{ID: "cmd-3", Payload: `{"account":"acc-1","amount":5}`},
		workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`},
		workertest.Command{ID: "cmd-4", Payload: `{"amount":`})
	k.WaitCaughtUp()
	k.Restart() // SIGINT, then the program again
	k.Redeliver()
	k.WaitCaughtUp()
	if err := k.Stop(); err != nil { // SIGINT: the program drains and flushes the outbox before it exits
		t.Fatal(err)
	}
	k.AssertRows("SELECT id, balance FROM accounts ORDER BY id", "acc-1 15", "acc-2 20")
	k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2", "topped-up-cmd-3")
	k.AssertDeadLetters("cmd-4", "cmd-4")
}

// The README's quick start is this program, as it is.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	main, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	_, block, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatal("README.md's Quick start has no Go code block")
	}
	block, _, ok = strings.Cut(block, "```\n")
	if !ok {
		t.Fatal("README.md's Quick start code block does not end")
	}
	if block != string(main) {
		t.Fatalf("README.md's Quick start differs from examples/quickstart/main.go: copy the file into the README")
	}
}

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// The quick start builds, and runs to its end against real Postgres and
// Kafka: the first run applies each command once, dead-letters the
// malformed one and sees the repeat as a duplicate; a second run applies
// nothing.
func TestQuickstart(t *testing.T) {
	db := pgtest.NewEmpty(t)
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	brokers := kafkatest.Brokers(t)
	prefix := kafkatest.Name("quickstart")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := &kafka.Client{Addr: kafka.TCP(brokers...)}
		_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{prefix + ".commands", prefix + ".events", prefix + ".dlq"}})
	})

	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	runOnce := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "-db", url, "-brokers", strings.Join(brokers, ","), "-schema", db.Schema, "-prefix", prefix)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("quickstart: %v\n%s", err, stderr.String())
		}
		return stdout.String()
	}
	for i, want := range []string{
		"applied 3, duplicates 1, dead-lettered 1\nacc-1: 15\nacc-2: 20\n",
		"applied 0, duplicates 4, dead-lettered 1\nacc-1: 15\nacc-2: 20\n",
	} {
		if got := runOnce(); got != want {
			t.Fatalf("run %d printed\n%s\nwant\n%s", i+1, got, want)
		}
	}

	var total int64
	if err := db.Pool.QueryRow(context.Background(), "SELECT sum(balance) FROM "+db.Table("accounts")).Scan(&total); err != nil || total != 35 {
		t.Fatalf("balances sum to %d (%v), want 35", total, err)
	}
	count := func(topic string, parts int) (n int64) {
		for _, o := range kafkatest.EndOffsets(t, topic, parts) {
			n += o
		}
		return n
	}
	// Each run dead-letters cmd-4 and publishes an event per applied or
	// duplicate command (a duplicate's is the stored one, with its UUID).
	if n := count(prefix+".dlq", 1); n != 2 {
		t.Errorf("%d records on the dead-letter topic, want 2", n)
	}
	if n := count(prefix+".events", 3); n != 8 {
		t.Errorf("%d records on the events topic, want 8", n)
	}
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

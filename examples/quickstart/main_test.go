package main

import (
	"bytes"
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// The quick start builds and runs as a worker against real Postgres and
// Kafka until it is interrupted: it creates its topics and tables, applies
// each command once, emits one event per command through the outbox and
// dead-letters the malformed one; run again on the same commands sent
// again, it applies nothing.
func TestQuickstart(t *testing.T) {
	db := pgtest.NewEmpty(t)
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", db.Schema)
	u.RawQuery = q.Encode()
	brokers := kafkatest.Brokers(t)
	kafkatest.RequireReal(t)
	prefix := kafkatest.Name("quickstart")
	commands, events := prefix+".commands", prefix+".events"
	dlq := commands + ".dlq" // the default dead-letter topic
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := &kafka.Client{Addr: kafka.TCP(brokers...)}
		_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{commands, events, dlq}})
	})

	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	send := func() {
		for _, c := range [][2]string{{"cmd-1", `{"account":"acc-1","amount":10}`}, {"cmd-2", `{"account":"acc-2","amount":20}`},
			{"cmd-3", `{"account":"acc-1","amount":5}`}, {"cmd-1", `{"account":"acc-1","amount":10}`}, {"cmd-4", `{"amount":`}} {
			msg := message.NewMessage(c[0], []byte(c[1]))
			msg.Metadata.Set(kafkapubsub.MetadataKafkaKey, c[0]) // the repeat of cmd-1 on cmd-1's partition, after it
			if err := pub.Publish(commands, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	partitions := func(topic string) int { // on a transport of its own: the shared one caches metadata
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
		md, err := c.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil {
			return 0
		}
		return len(md.Topics[0].Partitions)
	}
	count := func(topic string) (n int64) {
		parts := partitions(topic)
		if parts == 0 {
			return -1
		}
		for _, o := range kafkatest.EndOffsets(t, topic, parts) {
			n += o
		}
		return n
	}
	consumed := func() bool { // the group's committed offsets reached the commands topic's end
		want := kafkatest.EndOffsets(t, commands, partitions(commands))
		got := kafkatest.CommittedOffsets(t, "top-ups", commands, partitions(commands))
		for p, end := range want {
			if got[p] != end && end > 0 {
				return false
			}
		}
		return true
	}
	balances := func() string {
		var b strings.Builder
		rows, err := db.Pool.Query(context.Background(), "SELECT id, balance FROM "+db.Table("accounts")+" ORDER BY id")
		if err != nil {
			return err.Error()
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var balance int64
			_ = rows.Scan(&id, &balance)
			fmt.Fprintf(&b, "%s: %d\n", id, balance)
		}
		return b.String()
	}
	for run := 1; run <= 2; run++ {
		cmd := exec.Command(bin, "-db", u.String(), "-brokers", strings.Join(brokers, ","), "-prefix", prefix)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("run %d's output:\n%s", run, stderr.String())
			}
		})
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		testenv.WaitFor(t, time.Minute, "the quick start to create its topics", func() bool { return count(commands) >= 0 && count(events) >= 0 && count(dlq) >= 0 })
		send()
		testenv.WaitFor(t, time.Minute, "every command consumed", func() bool { return count(dlq) == int64(run) && consumed() })
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("run %d: %v\n%s", run, err, stderr.String())
			}
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("run %d did not stop within a minute of SIGINT\n%s", run, stderr.String())
		}
		if got, want := balances(), "acc-1: 15\nacc-2: 20\n"; got != want {
			t.Fatalf("after run %d the balances are\n%swant\n%s", run, got, want)
		}
		// One event per command, published by the outbox relay before
		// the worker exits; a duplicate adds none.
		if n := count(events); n != 3 {
			t.Fatalf("after run %d, %d records on the events topic, want 3\n%s", run, n, stderr.String())
		}
		var keys int
		if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Keys()).Scan(&keys); err != nil || keys != 3 {
			t.Fatalf("after run %d, %d keys (%v), want 3", run, keys, err)
		}
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

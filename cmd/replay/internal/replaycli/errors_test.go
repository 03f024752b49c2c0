package replaycli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
)

// With PGPASSWORD set and no database URL involved, an error is the error:
// no redacted URL woven between its characters.
func TestErrorWithoutDatabaseURL(t *testing.T) {
	t.Setenv("PGPASSWORD", "s3cr3t")
	t.Setenv("DATABASE_URL", "")
	code, out, errs := run("copy", "--brokers", "127.0.0.1:1", "--from", "t", "--to", "u")
	if code != replaycli.ExitKafka || len(errs) > 300 || strings.Contains(errs, "***") || strings.Contains(out+errs, "s3cr3t") {
		t.Fatalf("exit %d, %d bytes on stderr:\n%s", code, len(errs), errs)
	}
}

// A URL that does not parse still has its password hidden.
func TestUnparsableURLKeepsThePasswordOut(t *testing.T) {
	for _, url := range []string{
		"postgres://app:s3cr3t@127.0.0.1:5432/x?sslmode=bogus",
		"postgres://app:s3cr3t@127.0.0.1:notaport/x",
		"postgres://app:s3cr3t@127.0.0.1:5432/x?sslmode=verify-full&sslrootcert=/nonexistent.pem",
		"host=127.0.0.1 user=app password=s3cr3t sslmode=bogus",
	} {
		if got := replaycli.Redact(url); strings.Contains(got, "s3cr3t") {
			t.Errorf("Redact(%q) = %q", url, got)
		}
		code, out, errs := run("verify", "--brokers", "127.0.0.1:1", "--topic", "t", "--group", "g",
			"--database-url", url, "--checksum-sql", "SELECT 1")
		if code != replaycli.ExitDatabase || strings.Contains(out+errs, "s3cr3t") {
			t.Errorf("%s: exit %d\n%s%s", url, code, out, errs)
		}
	}
}

// A partition the topic does not have is a usage error.
func TestCopyUnknownPartitionIsUsage(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	code, _, errs := run("copy", "--brokers", brokers[0], "--from", topic, "--to", kafkatest.Topic(t, 2), "--partition", "99")
	if code != replaycli.ExitUsage || !strings.Contains(errs, "--partition 99") {
		t.Fatalf("exit %d\n%s", code, errs)
	}
}

// Leaving out --to, or naming the source, copies nothing unless
// --into-source says so.
func TestCopyIntoItselfOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("a")}, kafka.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, extra := range [][]string{nil, {"--to", topic}} {
		code, out, errs := run(append([]string{"copy", "--brokers", brokers[0], "--from", topic}, extra...)...)
		if code != replaycli.ExitUsage || !strings.Contains(errs, "--into-source") {
			t.Errorf("copy %v: exit %d\n%s%s", extra, code, out, errs)
		}
	}
	if end := kafkatest.EndOffsets(t, topic, 1)[0]; end != 2 {
		t.Fatalf("%d records after refused copies, want 2", end)
	}
	if code, out, errs := run("copy", "--brokers", brokers[0], "--from", topic, "--to", topic, "--into-source"); code != 0 {
		t.Fatalf("copy --into-source: exit %d\n%s%s", code, out, errs)
	}
	if end := kafkatest.EndOffsets(t, topic, 1)[0]; end != 4 {
		t.Fatalf("%d records after the copy into the source, want 4", end)
	}
}

// Help asked for goes to stdout with exit 0; no command is a usage error.
func TestHelpToStdout(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"copy", "-h"}, {"verify", "--help"}, {"rewind", "-h"}} {
		if code, out, errs := run(args...); code != 0 || out == "" || errs != "" {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q", args, code, len(out), errs)
		}
	}
	if code, out, errs := run(); code != replaycli.ExitUsage || out != "" || errs == "" {
		t.Errorf("no command: exit %d, stdout %q", code, out)
	}
	if code, out, errs := run("copy", "--nope"); code != replaycli.ExitUsage || out != "" || !strings.Contains(errs, "nope") {
		t.Errorf("unknown flag: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

package replaycli_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// replay console serves the page standalone: the topic's partitions with
// the group's committed offset, read-only without a token (a POST is
// refused), and it stops when its context ends.
func TestConsoleStandalone(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	db := pgtest.New(t)
	dbURL, _ := pgtest.URL()
	brokers := kafkatest.Brokers(t)
	topic, dlq := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(context.Background(), kafka.Message{Value: []byte("a")}, kafka.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("console", "--brokers", brokers[0], "--database-url", ""); code != replaycli.ExitUsage || !strings.Contains(errs, "--database-url") {
		t.Fatalf("without a database: exit %d %s", code, errs)
	}

	ctx, stop := context.WithCancel(context.Background())
	var stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- replaycli.Main(ctx, []string{"console", "--brokers", brokers[0], "--database-url", dbURL, "--schema", db.Schema,
			"--group", "g", "--topic", topic, "--dlq", dlq, "--addr", "127.0.0.1:0"}, io.Discard, &stderr)
	}()
	var base string
	testenv.WaitFor(t, 30*time.Second, "replay console serving", func() bool {
		_, rest, ok := strings.Cut(stderr.String(), "serving ")
		base, _, _ = strings.Cut(rest, " ")
		return ok && strings.HasSuffix(base, "/")
	})
	res, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(page), "<td>"+topic+"</td>") || !strings.Contains(string(page), "read-only") {
		t.Fatalf("GET %s: %d\n%s", base, res.StatusCode, page)
	}
	res, err = http.PostForm(base, url.Values{"action": {"redrive"}, "partition": {"0"}, "offset": {"0"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("POST without a token configured: %d, want 403", res.StatusCode)
	}
	stop()
	if code := <-done; code != replaycli.ExitOK {
		t.Fatalf("exit %d after its context ended: %s", code, stderr.String())
	}
}

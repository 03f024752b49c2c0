package httpkey_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/httpkey"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// logRecords keeps the messages of the records logged at WARN or above.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecords) Enabled(_ context.Context, lvl slog.Level) bool { return lvl >= slog.LevelWarn }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

func (l *logRecords) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// An API whose outbox no relay publishes: its events wait, the backlog (the
// gauge's source) says how many and for how long, and the middleware warns
// once the oldest has waited longer than StaleOutbox. Before, nothing was
// logged and the events stayed PENDING for ever.
func TestOutboxNobodyRelaysIsReported(t *testing.T) {
	logs := &logRecords{}
	f := newFixture(t, &httpkey.Config{StaleOutbox: 100 * time.Millisecond, Logger: slog.New(logs)})
	if w := f.do(call{key: `"e1"`, body: `{"amount":1}`}); w.Code != 201 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	w, err := outbox.NewWriter(&outbox.Config{Schema: f.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	backlog, err := w.Backlog(f.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "the backlog older than StaleOutbox", func() bool {
		st, err := backlog.Stats(context.Background())
		return err == nil && st.Pending == 1 && st.Lag > 100*time.Millisecond
	})
	key := 2
	testenv.WaitFor(t, time.Minute, "a WARN that no relay publishes the outbox", func() bool {
		if w := f.do(call{key: fmt.Sprintf(`"e%d"`, key), body: `{"amount":1}`}); w.Code != 201 {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		key++
		return logs.has("no relay publishes it")
	})
}

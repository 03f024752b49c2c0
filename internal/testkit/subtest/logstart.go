package subtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// A database restored to a position below the start of the partition's
// log (retention removed the records there) starts the partition at the
// oldest record Kafka still holds, whatever StartOffset says: 20 records
// consumed, those below 10 deleted, the position set back to 5, one more
// record produced: records 10 to 20 are delivered again, not record 20
// alone (StartLast, where Kafka's reset jumps to the end). The records
// Kafka no longer holds are logged at ERROR (checked second: the state
// comes first).
func PositionsRestoreBelowLogStart(t *testing.T, tr Transport) {
	for _, c := range []struct {
		name  string
		start kafkapubsub.StartOffset
	}{{"StartLast", kafkapubsub.StartLast}, {"StartFirst", kafkapubsub.StartFirst}} {
		t.Run(c.name, func(t *testing.T) { positionsRestoreBelowLogStart(t, tr, c.start) })
	}
}

func positionsRestoreBelowLogStart(t *testing.T, tr Transport, start kafkapubsub.StartOffset) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	position := func() int64 {
		t.Helper()
		got, err := positions.Load(ctx, group, topic, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := got[0]; ok {
			return p
		}
		return -1
	}
	errs := &errorLog{}
	cfg := &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions, StartOffset: start,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond,
		Logger: slog.New(errs)}
	first := *cfg
	first.StartOffset = kafkapubsub.StartFirst
	ProduceKeyed(t, brokers, topic, 20, 4)
	_, stop := consumeAll(t, tr, &first, topic)
	testenv.WaitFor(t, time.Minute, "the 20 records consumed and saved", func() bool { return position() == 20 })
	stop()
	WaitCommitted(t, group, topic, 1, time.Minute)

	kafkatest.DeleteRecords(t, topic, 0, 10)
	// The database restored to when its position was 5.
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: 5}, nil); err != nil {
		t.Fatal(err)
	}
	ProduceKeyed(t, brokers, topic, 1, 1)
	errs.reset()
	d, stop := consumeAll(t, tr, cfg, topic)
	for deadline := time.Now().Add(30 * time.Second); position() != 21; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a restore to 5 with the log starting at 10, the position is %d and the records delivered %v, want %v, and 21 saved",
				position(), d.of(0), offsetRange(10, 21))
		}
	}
	stop()
	if got, want := d.of(0), offsetRange(10, 21); !slicesEqual(got, want) {
		t.Fatalf("after a restore to 5 with the log starting at 10, delivered %v, want %v: every record Kafka holds from the database's position on", got, want)
	}
	if !errs.has("log_start") {
		t.Errorf("no ERROR naming log_start for the records below it that Kafka no longer holds (errors: %v)", errs.all())
	}
}

// errorLog is a slog.Handler that keeps the ERROR records (message and
// attributes as text), and writes everything to the suite's Logger too.
type errorLog struct {
	mu    sync.Mutex
	lines []string
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelError || Logger().Enabled(context.Background(), l)
}

func (h *errorLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
		h.mu.Lock()
		h.lines = append(h.lines, b.String())
		h.mu.Unlock()
	}
	return Logger().Handler().Handle(ctx, r)
}

func (h *errorLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &errorLogView{h: h, attrs: as}
}

func (h *errorLog) WithGroup(string) slog.Handler { return h }

func (h *errorLog) reset() {
	h.mu.Lock()
	h.lines = nil
	h.mu.Unlock()
}

func (h *errorLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

func (h *errorLog) has(s string) bool {
	for _, l := range h.all() {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// errorLogView is an errorLog with attributes added.
type errorLogView struct {
	h     *errorLog
	attrs []slog.Attr
}

func (v *errorLogView) Enabled(ctx context.Context, l slog.Level) bool { return v.h.Enabled(ctx, l) }

func (v *errorLogView) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(v.attrs...)
	return v.h.Handle(ctx, r)
}

func (v *errorLogView) WithAttrs(as []slog.Attr) slog.Handler {
	return &errorLogView{h: v.h, attrs: append(append([]slog.Attr(nil), v.attrs...), as...)}
}

func (v *errorLogView) WithGroup(string) slog.Handler { return v }

package eprom_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/plugin/eprom"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// value returns the metric name's value for the labels (counter, gauge, or
// a histogram's sample count); -1 when there is no such series.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// The middleware's events become counters per scope, topic and outcome,
// latency histograms and dead-letter counts; the key table's gauges are
// read at scrape.
func TestMessages(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("hits")+" (n int)"); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	m := eprom.New(nil)
	m.WatchKeys(store)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	dedup, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "hits", Hooks: m, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h := dedup.Middleware(consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, _ *message.Message) ([]*message.Message, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+db.Table("hits")+" VALUES (1)")
		return nil, err
	}))
	deliver := func(uuid, payload string) error {
		msg := message.NewMessage(uuid, []byte(payload))
		msg.SetContext(dedupe.ContextWithSource(context.Background(), dedupe.Source{Topic: "orders", Partition: 0, Offset: 7}))
		_, err := h(msg)
		return err
	}
	id := watermill.NewUUID()
	for range 2 {
		if err := deliver(id, `{"n":1}`); err != nil {
			t.Fatal(err)
		}
	}
	if err := deliver(id, `{"n":2}`); err == nil {
		t.Fatal("a key reused with another payload was accepted")
	}
	var hits int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("hits")).Scan(&hits); err != nil || hits != 1 {
		t.Fatalf("hits = %d (%v), want 1", hits, err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"exactly_messages_total", map[string]string{"scope": "hits", "topic": "orders", "outcome": "applied"}, 1},
		{"exactly_messages_total", map[string]string{"scope": "hits", "topic": "orders", "outcome": "duplicate"}, 1},
		{"exactly_messages_total", map[string]string{"scope": "hits", "topic": "orders", "outcome": "key_reused"}, 1},
		{"exactly_message_duration_seconds", map[string]string{"scope": "hits", "outcome": "applied"}, 1},
		{"exactly_dead_lettered_total", map[string]string{"scope": "hits", "topic": "orders"}, 1},
		{"exactly_keys", map[string]string{"status": "completed"}, 1},
		{"exactly_keys", map[string]string{"status": "processing"}, 0},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// The relay's batches become publish counters; the outbox's pending gauge
// is read at scrape.
func TestOutbox(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(&outbox.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pub.Close()
	m := eprom.New(&eprom.Config{Namespace: "svc"})
	relay, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: db.Schema}, Hooks: m, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	m.WatchOutbox(relay)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("a")),
		message.NewMessage(watermill.NewUUID(), []byte("b")), message.NewMessage(watermill.NewUUID(), []byte("c"))}
	if err := w.WriteTx(ctx, tx, "events", msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "svc_outbox_pending", nil); got != 3 {
		t.Fatalf("svc_outbox_pending = %v before the relay ran, want 3", got)
	}
	for published := 0; published < 3; {
		n, err := relay.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("the relay published %d of 3 messages, then nothing", published)
		}
		published += n
	}
	for name, want := range map[string]float64{"svc_outbox_pending": 0, "svc_outbox_dead": 0,
		"svc_outbox_published_total": 3, "svc_outbox_publish_failures_total": 0} {
		if got := value(t, reg, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := value(t, reg, "svc_outbox_batches_total", nil); got < 1 {
		t.Errorf("svc_outbox_batches_total = %v, want at least 1", got)
	}
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := eprom.New(nil).Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := eprom.New(nil).Register(reg); err == nil {
		t.Fatal("two Metrics with one namespace registered on one registry")
	}
	if err := eprom.New(&eprom.Config{Namespace: "other"}).Register(reg); err != nil {
		t.Fatal(err)
	}
}

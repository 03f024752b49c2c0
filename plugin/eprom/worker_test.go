package eprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/plugin/eprom"
	"github.com/exactly-go/exactly/worker"
)

// The Metrics as one plugin of a worker get its messages' events, its
// relay's batches, and the gauges of its key table and outbox at scrape,
// with no other wiring.
func TestWorkerPlugin(t *testing.T) {
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("hits")+" (id text)"); err != nil {
		t.Fatal(err)
	}
	brokers := kafkatest.Brokers(t)
	commands, events := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
	kafkatest.CreateTopic(t, commands+".dlq", 1)
	group := kafkatest.Name("g")
	m := eprom.New(nil)
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	wk, err := worker.New(db.Pool, &worker.Config{Scope: "hits", Schema: db.Schema, Brokers: brokers, Topic: commands,
		OutputTopic: events, Group: group, Tables: []string{"hits"}, Logger: quiet(),
		StartupBackoff: 200 * time.Millisecond, RelayPollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+db.Table("hits")+" VALUES ($1)", msg.UUID)
			return []*message.Message{message.NewMessage("", msg.Payload)}, err
		},
		Plugins: []worker.Plugin{m}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wk.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, id := range []string{"a", "b", "a", "b"} {
		if err := pub.Publish(commands, message.NewMessage(id, []byte(`{"id":"`+id+`"}`))); err != nil {
			t.Fatal(err)
		}
	}
	applied := map[string]string{"scope": "hits", "topic": commands, "outcome": "applied"}
	duplicate := map[string]string{"scope": "hits", "topic": commands, "outcome": "duplicate"}
	testenv.WaitFor(t, time.Minute, "two applied, two duplicates, two events published, all four committed", func() bool {
		return value(t, reg, "exactly_messages_total", applied) == 2 && value(t, reg, "exactly_messages_total", duplicate) == 2 &&
			value(t, reg, "exactly_outbox_published_total", nil) == 2 &&
			kafkatest.CommittedOffsets(t, group, commands, 1)[0] == 4
	})
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"exactly_keys", map[string]string{"status": "completed"}, 2},
		{"exactly_outbox_pending", nil, 0},
		{"exactly_outbox_dead", nil, 0},
		{"exactly_partition_lag", map[string]string{"topic": commands, "partition": "0"}, 0},
		{"exactly_position_gap", map[string]string{"topic": commands, "partition": "0"}, 0},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

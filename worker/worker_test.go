package worker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// world is a schema with exactly's tables and a counter table, and a
// commands topic with its events and dead-letter topics.
type world struct {
	t                     *testing.T
	db                    *pgtest.DB
	brokers               []string
	commands, events, dlq string
}

func newWorld(t *testing.T, partitions int) *world {
	t.Helper()
	kafkatest.RequireReal(t)
	w := &world{t: t, db: pgtest.New(t), brokers: kafkatest.Brokers(t)}
	w.commands, w.events, w.dlq = kafkatest.Topic(t, partitions), kafkatest.Topic(t, 3), kafkatest.Topic(t, 1)
	if _, err := w.db.Pool.Exec(context.Background(), "CREATE TABLE "+w.db.Table("applied")+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return w
}

// handler records each message in the applied table (n counts applications)
// and returns one output per message.
func (w *world) handler(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	if _, err := tx.Exec(ctx, "INSERT INTO "+w.db.Table("applied")+" VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID); err != nil {
		return nil, err
	}
	return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
}

// batchHandler is handler on each message of a batch, in order.
func (w *world) batchHandler(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	outs := make([][]*message.Message, len(msgs))
	for i, m := range msgs {
		o, err := w.handler(ctx, tx, m)
		if err != nil {
			return nil, err
		}
		outs[i] = o
	}
	return outs, nil
}

func (w *world) config(mod func(*worker.Config)) *worker.Config {
	c := &worker.Config{Scope: "test", Schema: w.db.Schema, Brokers: w.brokers, Topic: w.commands, OutputTopic: w.events,
		DeadLetterTopic: w.dlq, Group: kafkatest.Name("g"), Handler: w.handler, Tables: []string{"applied"},
		Logger: quiet(), StartupBackoff: 200 * time.Millisecond}
	if mod != nil {
		mod(c)
	}
	return c
}

// start runs a worker until the returned stop is called; stop returns Run's error.
func (w *world) start(cfg *worker.Config) (wk *worker.Worker, stop func() error) {
	w.t.Helper()
	wk, err := worker.New(w.db.Pool, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * time.Minute):
			w.t.Fatal("the worker did not stop within 2 minutes")
			return nil
		}
	}
	w.t.Cleanup(func() { _ = stop() })
	return wk, stop
}

// send publishes one message per id, each twice, keyed by its id.
func (w *world) send(ids ...string) {
	w.t.Helper()
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.brokers})
	if err != nil {
		w.t.Fatal(err)
	}
	defer pub.Close()
	var msgs []*message.Message
	for _, id := range ids {
		for range 2 {
			m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
			m.Metadata.Set(kafkapubsub.MetadataKafkaKey, id)
			msgs = append(msgs, m)
		}
	}
	if err := pub.Publish(w.commands, msgs...); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) count(sql string) int {
	w.t.Helper()
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *world) records(topic string, partitions int) int64 {
	var n int64
	for _, o := range kafkatest.EndOffsets(w.t, topic, partitions) {
		n += o
	}
	return n
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("m-%03d", i)
	}
	return out
}

// Every message is applied once, its output leaves through the outbox, and
// a stop publishes the outputs of the last messages before Run returns:
// nothing is left in the outbox, nothing is on the events topic twice.
func TestWorkerAppliesOnceAndFlushesOnStop(t *testing.T) {
	for _, mode := range []string{"per-message", "keyed", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 4)
			// The relay learns of new rows only from its polls (hourly
			// here) once the NOTIFY trigger is off: the stop's flush must
			// publish them.
			if _, err := w.db.Pool.Exec(context.Background(), "ALTER TABLE "+w.db.Table("exactly_outbox")+" DISABLE TRIGGER exactly_outbox_notify"); err != nil {
				t.Fatal(err)
			}
			var handled atomic.Int64
			cfg := w.config(func(c *worker.Config) {
				c.NoRelay = false
				c.RelayPollInterval = time.Hour // only the final flush publishes
				c.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
					if ev.Outcome == consumer.OutcomeApplied || ev.Outcome == consumer.OutcomeDuplicate {
						handled.Add(1)
					}
				})
				switch mode {
				case "keyed":
					c.MaxInFlight, c.KeyOrdered = 8, true
				case "batch":
					c.Handler, c.BatchSize = nil, 50
					c.BatchHandler = w.batchHandler
				}
			})
			_, stop := w.start(cfg)
			w.send(ids(100)...)
			testenv.WaitFor(t, time.Minute, "200 messages handled", func() bool { return handled.Load() >= 200 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n = 1"); n != 100 {
				t.Errorf("%d messages applied once, want 100 (twice or more: %d)", n, w.count("SELECT count(*) FROM "+w.db.Table("applied")+" WHERE n > 1"))
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_outbox") + " WHERE status <> 'PUBLISHED'"); n != 0 {
				t.Errorf("%d outbox rows not published after the stop, want 0", n)
			}
			if n := w.records(w.events, 3); n != 100 {
				t.Errorf("%d records on the events topic, want 100", n)
			}
			if n := w.records(w.dlq, 1); n != 0 {
				t.Errorf("%d dead letters, want 0", n)
			}
			// The positions are kept with the data: the committed offsets
			// are in Postgres too (200 records on 4 partitions).
			if n := w.count("SELECT coalesce(sum(next_offset), 0)::int FROM " + w.db.Table("exactly_positions") +
				" WHERE consumer_group = '" + cfg.Group + "'"); n != 200 {
				t.Errorf("the positions in Postgres sum to %d, want 200", n)
			}
		})
	}
}

// A handler that returns outputs on a worker with no OutputTopic does not
// lose them: the message is not applied, not dead-lettered and not
// committed; once the worker is configured with the topic, it is applied
// once with its output.
func TestOutputsWithoutOutputTopicAreNeverDropped(t *testing.T) {
	w := newWorld(t, 1)
	var misconfigured atomic.Int64
	cfg := w.config(func(c *worker.Config) {
		c.OutputTopic = ""
		c.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
			if ev.Err != nil && strings.Contains(ev.Err.Error(), "OutputTopic is empty") {
				misconfigured.Add(1)
			}
		})
	})
	_, stop := w.start(cfg)
	w.send("only")
	testenv.WaitFor(t, time.Minute, "the refused outputs", func() bool { return misconfigured.Load() >= 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("applied")); n != 0 {
		t.Fatalf("%d rows applied while the outputs had nowhere to go, want 0", n)
	}
	if n := w.records(w.dlq, 1); n != 0 {
		t.Fatalf("%d dead letters for a configuration error, want 0", n)
	}

	var handled atomic.Int64
	cfg.OutputTopic = w.events
	cfg.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
		if ev.Outcome == consumer.OutcomeApplied || ev.Outcome == consumer.OutcomeDuplicate {
			handled.Add(1)
		}
	})
	_, stop = w.start(cfg)
	testenv.WaitFor(t, time.Minute, "both copies handled", func() bool { return handled.Load() >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n = 1"); n != 1 {
		t.Fatalf("%d messages applied once, want 1", n)
	}
	if n := w.records(w.events, 3); n != 1 {
		t.Fatalf("%d records on the events topic, want 1", n)
	}
}

// A worker whose topics do not exist waits, and says so in Health, until
// they do; with CreateTopics it creates them.
func TestWorkerWaitsForItsTopics(t *testing.T) {
	w := newWorld(t, 1)
	w.commands, w.dlq = kafkatest.Name("missing"), kafkatest.Name("missing-dlq")
	wk, _ := w.start(w.config(nil))
	testenv.WaitFor(t, time.Minute, "Health to name the topics", func() bool {
		err := wk.Health(context.Background())
		return err != nil && strings.Contains(err.Error(), "kafka topics")
	})
	select {
	case <-wk.Running():
		t.Fatal("the worker consumes without its topics")
	default:
	}
	kafkatest.CreateTopic(t, w.commands, 2)
	kafkatest.CreateTopic(t, w.dlq, 1)
	select {
	case <-wk.Running():
	case <-time.After(time.Minute):
		t.Fatalf("the worker did not start once its topics existed: %v", wk.Health(context.Background()))
	}
	testenv.WaitFor(t, time.Minute, "Health to be nil", func() bool { return wk.Health(context.Background()) == nil })

	created := newWorld(t, 1)
	created.commands, created.dlq = kafkatest.Name("created"), kafkatest.Name("created-dlq")
	wk2, _ := created.start(created.config(func(c *worker.Config) { c.CreateTopics, c.TopicPartitions = true, 3 }))
	select {
	case <-wk2.Running():
	case <-time.After(time.Minute):
		t.Fatalf("the worker did not create its topics: %v", wk2.Health(context.Background()))
	}
	if n := len(kafkatest.EndOffsets(t, created.commands, 3)); n != 3 {
		t.Fatalf("the created commands topic has %d partitions, want 3", n)
	}
}

type nopTransport struct{}

func (nopTransport) NewSubscriber(*kafkapubsub.SubscriberConfig) (message.Subscriber, error) {
	return nil, nil
}
func (nopTransport) NewPublisher(*kafkapubsub.PublisherConfig) (message.Publisher, error) {
	return nil, nil
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// Misconfiguration is refused by New, with the field and the fix.
func TestNewRefusesMisconfiguration(t *testing.T) {
	h := func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) { return nil, nil }
	bh := func(context.Context, pgx.Tx, []*message.Message) ([][]*message.Message, error) { return nil, nil }
	base := worker.Config{Scope: "s", Topic: "t", Brokers: []string{"127.0.0.1:1"}, Handler: h}
	for _, c := range []struct {
		name string
		mod  func(*worker.Config)
		want string
	}{
		{"no scope", func(c *worker.Config) { c.Scope = "" }, "Config.Scope is empty"},
		{"no topic", func(c *worker.Config) { c.Topic = "" }, "Config.Topic is empty"},
		{"no handler", func(c *worker.Config) { c.Handler = nil }, "set Config.Handler"},
		{"two handlers", func(c *worker.Config) { c.BatchHandler = bh }, "both set"},
		{"no brokers", func(c *worker.Config) { c.Brokers = nil }, "Config.Brokers is empty"},
		{"outputs to itself", func(c *worker.Config) { c.OutputTopic = "t" }, "consume its own outputs"},
		{"dead letters to itself", func(c *worker.Config) { c.DeadLetterTopic = "t" }, "consumed again"},
		{"keyed batch", func(c *worker.Config) { c.Handler, c.BatchHandler, c.KeyOrdered = nil, bh, true }, "KeyOrdered is for Handler"},
		{"transport beside a publisher", func(c *worker.Config) { c.Transport, c.Publisher = nopTransport{}, nopPublisher{} }, "Config.Transport is set with"},
	} {
		cfg := base
		c.mod(&cfg)
		_, err := worker.New(pgtest.Pool(t), &cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New returned %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := worker.New(nil, &base); err == nil {
		t.Error("New accepted a nil pool")
	}
}

// With KeyLayout LayoutPartitioned the worker keeps its keys in the
// partitioned table (its first partitions created at start-up) and
// deduplicates against the keys a LayoutSingleTable worker wrote before it:
// after the switch, the old messages delivered again are not applied
// again, and the new ones are applied once, their keys in exactly_keys2.
func TestWorkerPartitionedKeys(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 2)
			setMode := func(c *worker.Config) {
				if mode == "batch" {
					c.Handler, c.BatchSize = nil, 20
					c.BatchHandler = w.batchHandler
				}
			}
			v7 := func(n int) []string {
				out := make([]string, n)
				for i := range out {
					out[i] = uuid.Must(uuid.NewV7()).String()
				}
				return out
			}
			old, fresh := v7(30), v7(30)
			group := kafkatest.Name("g")
			run := func(layout pgstore.Layout, send []string, want int) {
				t.Helper()
				var handled atomic.Int64
				cfg := w.config(func(c *worker.Config) {
					c.Group, c.KeyLayout = group, layout
					// No clean-up runner: the first partitions come from the
					// start-up check alone.
					c.CleanupInterval = -1
					c.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
						if ev.Outcome == consumer.OutcomeApplied || ev.Outcome == consumer.OutcomeDuplicate {
							handled.Add(1)
						}
					})
					setMode(c)
				})
				_, stop := w.start(cfg)
				w.send(send...)
				testenv.WaitFor(t, time.Minute, fmt.Sprintf("%d messages handled", want), func() bool { return handled.Load() >= int64(want) })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			}
			run(pgstore.LayoutSingleTable, old, 2*len(old))
			// The old messages once more (a replay after the switch), and new ones.
			run(pgstore.LayoutPartitioned, append(slices.Clone(old), fresh...), 2*(len(old)+len(fresh)))
			if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n = 1"); n != len(old)+len(fresh) {
				t.Errorf("%d messages applied once, want %d (twice or more: %d)", n, len(old)+len(fresh),
					w.count("SELECT count(*) FROM "+w.db.Table("applied")+" WHERE n > 1"))
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_keys")); n != len(old) {
				t.Errorf("%d keys in exactly_keys, want the %d of the legacy worker", n, len(old))
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_keys2")); n != len(fresh) {
				t.Errorf("%d keys in exactly_keys2, want the %d new ones", n, len(fresh))
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("exactly_keys2_other")); n != 0 {
				t.Errorf("%d time-ordered keys in the partition of other IDs, want 0 (in their day partitions)", n)
			}
			if n := w.records(w.events, 3); n != int64(len(old)+len(fresh)) {
				t.Errorf("%d records on the events topic, want %d", n, len(old)+len(fresh))
			}
			if n := w.records(w.dlq, 1); n != 0 {
				t.Errorf("%d dead letters, want 0", n)
			}
		})
	}
}

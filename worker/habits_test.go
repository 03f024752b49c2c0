package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/worker"
)

// sendOnce publishes one message per id to topic, keyed by its id.
func (w *world) sendOnce(topic string, ids ...string) {
	w.t.Helper()
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.brokers})
	if err != nil {
		w.t.Fatal(err)
	}
	defer pub.Close()
	for _, id := range ids {
		m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
		m.Metadata.Set(kafkapubsub.MetadataKafkaKey, id)
		if err := pub.Publish(topic, m); err != nil {
			w.t.Fatal(err)
		}
	}
}

// committed is the group's committed offset on partition 0 of topic (0
// when it committed none).
func (w *world) committed(group, topic string) int64 {
	w.t.Helper()
	return kafkatest.CommittedOffsets(w.t, group, topic, 1)[0]
}

func (w *world) appliedOnce() int {
	w.t.Helper()
	return w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n = 1")
}

// A handler that acks its message and then fails does not lose it: only the
// library acks, after the commit, so the message is delivered again and
// applied once.
func TestHandlerAckIsIgnored(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 1)
			var mu sync.Mutex
			failed := map[string]bool{}
			// failFirst reports whether this is msg's first run, which fails.
			failFirst := func(msg *message.Message) bool {
				mu.Lock()
				defer mu.Unlock()
				if failed[msg.UUID] {
					return false
				}
				failed[msg.UUID] = true
				return true
			}
			cfg := w.config(func(c *worker.Config) {
				c.Handler = func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
					msg.Ack() // the habit of a raw Subscriber loop
					if failFirst(msg) {
						return nil, errors.New("the first run fails")
					}
					return w.handler(ctx, tx, msg)
				}
				if mode == "batch" {
					c.Handler, c.BatchSize = nil, 10
					c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
						fail := false
						for _, m := range msgs {
							m.Ack()
							fail = failFirst(m) || fail
						}
						if fail {
							// A failure that is no message's fault: the batch is
							// nacked whole, to be delivered again.
							return nil, fmt.Errorf("%w: the first run fails", dedupe.ErrMisconfigured)
						}
						return w.batchHandler(ctx, tx, msgs)
					}
				}
			})
			_, stop := w.start(cfg)
			w.sendOnce(w.commands, "a", "b")
			testenv.WaitFor(t, time.Minute, "both commands applied", func() bool { return w.appliedOnce() == 2 })
			testenv.WaitFor(t, time.Minute, "both offsets committed", func() bool { return w.committed(cfg.Group, w.commands) == 2 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n > 1"); n != 0 {
				t.Fatalf("%d commands applied twice", n)
			}
			if n := w.records(w.dlq, 1); n != 0 {
				t.Fatalf("%d dead letters, want 0", n)
			}
		})
	}
}

// Two workers that share a Scope on different topics do not skip each
// other's commands as duplicates: a command whose key was applied from the
// other topic is held (not applied, not committed, not dead-lettered) with
// an error naming Scope, and so is everything behind it on its partition;
// with AcrossTopics the copies are duplicates and the rest is applied.
func TestScopeSharedAcrossTopicsIsHeld(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 1)
			other := kafkatest.Topic(t, 1)
			first := w.config(func(c *worker.Config) { c.Scope = "shared" })
			_, stopFirst := w.start(first)
			w.sendOnce(w.commands, "x1", "x2")
			testenv.WaitFor(t, time.Minute, "the first worker's commands applied", func() bool { return w.appliedOnce() == 2 })
			if err := stopFirst(); err != nil {
				t.Fatal(err)
			}

			var refused, duplicates atomic.Int64
			second := w.config(func(c *worker.Config) {
				c.Scope, c.Topic, c.Group = "shared", other, kafkatest.Name("g")
				c.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
					switch {
					case ev.Outcome == consumer.OutcomeMisconfigured && errors.Is(ev.Err, dedupe.ErrMisconfigured) &&
						strings.Contains(ev.Err.Error(), `Config.Scope "shared"`):
						refused.Add(1)
					case ev.Outcome == consumer.OutcomeDuplicate:
						duplicates.Add(1)
					}
				})
				if mode == "batch" {
					c.Handler, c.BatchSize = nil, 10
					c.BatchHandler = w.batchHandler
				}
			})
			_, stop := w.start(second)
			// Copies of the first topic's commands, then one of its own.
			w.sendOnce(other, "x1", "x2", "y1")
			testenv.WaitFor(t, time.Minute, "the copy refused three times", func() bool { return refused.Load() >= 3 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := w.committed(second.Group, other); n != 0 {
				t.Fatalf("the second worker committed offset %d past commands it skipped, want 0", n)
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE id = 'y1'"); n != 0 {
				t.Fatalf("y1 applied behind a held command")
			}
			if n := w.records(w.dlq, 1); n != 0 {
				t.Fatalf("%d dead letters for a configuration error, want 0", n)
			}
			if d := duplicates.Load(); d != 0 {
				t.Fatalf("%d copies from the other topic counted as duplicates, want 0", d)
			}

			second.AcrossTopics = true
			_, stop = w.start(second)
			testenv.WaitFor(t, time.Minute, "all three committed", func() bool { return w.committed(second.Group, other) == 3 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := w.appliedOnce(); n != 3 {
				t.Fatalf("%d commands applied once, want 3 (x1, x2 from the first topic, y1)", n)
			}
			if n := w.count("SELECT count(*) FROM " + w.db.Table("applied") + " WHERE n > 1"); n != 0 {
				t.Fatalf("%d commands applied twice", n)
			}
			if d := duplicates.Load(); d != 2 {
				t.Fatalf("%d duplicates with AcrossTopics, want 2", d)
			}
		})
	}
}

// A pool closed under a running worker ends Run with an error; the command
// that arrived after the close is neither applied nor committed, and the
// next worker applies it.
func TestRunFailsWhenItsPoolIsClosed(t *testing.T) {
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, 1)
			pool, err := pgxpool.New(context.Background(), w.db.Pool.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			cfg := w.config(func(c *worker.Config) {
				if mode == "batch" {
					c.Handler, c.BatchSize = nil, 10
					c.BatchHandler = w.batchHandler
				}
			})
			wk, err := worker.New(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- wk.Run(ctx) }()
			w.sendOnce(w.commands, "before")
			testenv.WaitFor(t, time.Minute, "the first command applied", func() bool { return w.appliedOnce() == 1 })
			testenv.WaitFor(t, time.Minute, "its offset committed", func() bool { return w.committed(cfg.Group, w.commands) == 1 })
			pool.Close()
			w.sendOnce(w.commands, "after")
			var runErr error
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				cancel()
				select {
				case runErr = <-done:
				case <-time.After(time.Minute):
					t.Fatal("Run went on for a minute with its pool closed, and did not return within a minute of its cancel")
				}
				t.Fatalf("Run went on for a minute with its pool closed, and returned %v once cancelled", runErr)
			}
			if runErr == nil || !strings.Contains(runErr.Error(), "pool was closed") {
				t.Fatalf("Run returned %v, want the closed pool's error", runErr)
			}
			if n := w.committed(cfg.Group, w.commands); n != 1 {
				t.Fatalf("committed offset %d after the close, want 1", n)
			}
			_, stop := w.start(cfg)
			testenv.WaitFor(t, time.Minute, "the next worker applies the second command", func() bool { return w.appliedOnce() == 2 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A batch handler that returns the wrong number of output slices breaks its
// contract: nothing is applied, committed or dead-lettered, each attempt is
// a configuration error; once it is fixed every command is applied once.
func TestBatchResultOfWrongLengthIsHeld(t *testing.T) {
	w := newWorld(t, 1)
	var broken atomic.Bool
	broken.Store(true)
	var misconfigured atomic.Int64
	cfg := w.config(func(c *worker.Config) {
		c.Handler, c.BatchSize = nil, 10
		c.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			outs, err := w.batchHandler(ctx, tx, msgs)
			if err == nil && broken.Load() {
				outs = append(outs, nil)
			}
			return outs, err
		}
		c.Hooks = consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
			if ev.Outcome == consumer.OutcomeMisconfigured && strings.Contains(ev.Err.Error(), "output slices") {
				misconfigured.Add(1)
			}
		})
	})
	_, stop := w.start(cfg)
	w.sendOnce(w.commands, "a", "b", "c")
	testenv.WaitFor(t, time.Minute, "three refused attempts", func() bool { return misconfigured.Load() >= 9 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.count("SELECT count(*) FROM " + w.db.Table("applied")); n != 0 {
		t.Fatalf("%d commands applied by a handler that broke its contract, want 0", n)
	}
	if n := w.committed(cfg.Group, w.commands); n != 0 {
		t.Fatalf("committed offset %d, want 0", n)
	}
	if n := w.records(w.dlq, 1); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	broken.Store(false)
	_, stop = w.start(cfg)
	testenv.WaitFor(t, time.Minute, "all three committed", func() bool { return w.committed(cfg.Group, w.commands) == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.appliedOnce(); n != 3 {
		t.Fatalf("%d commands applied once, want 3", n)
	}
}

// tracerLike is a plugin in the shape of plugin/eotel's Tracer: a
// Middleware that starts each message's span and a Hooks that ends it.
type tracerLike struct {
	started, ended atomic.Int64
	unstarted      atomic.Int64 // events of a message whose Middleware never ran
}

type spanKey struct{}

func (p *tracerLike) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		p.started.Add(1)
		msg.SetContext(context.WithValue(msg.Context(), spanKey{}, true))
		return h(msg)
	}
}

func (p *tracerLike) OnMessage(ctx context.Context, _ consumer.Event) {
	p.ended.Add(1)
	if ctx.Value(spanKey{}) == nil {
		p.unstarted.Add(1)
	}
}

// A plugin given as Config.Hooks (a new user's reading of "Hooks receives
// an Event per message") is installed whole, as in Plugins: its Middleware
// wraps each message, and its hooks run once per event, also when it is
// listed in Plugins too.
func TestHooksThatIsAPluginIsInstalledWhole(t *testing.T) {
	for _, also := range []bool{false, true} {
		t.Run(fmt.Sprintf("also-in-plugins=%v", also), func(t *testing.T) {
			w := newWorld(t, 1)
			p := &tracerLike{}
			cfg := w.config(func(c *worker.Config) {
				c.Hooks = p
				if also {
					c.Plugins = []worker.Plugin{p}
				}
			})
			_, stop := w.start(cfg)
			w.sendOnce(w.commands, "a", "b")
			testenv.WaitFor(t, time.Minute, "both commands applied", func() bool { return w.appliedOnce() == 2 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if s, e, u := p.started.Load(), p.ended.Load(), p.unstarted.Load(); s != 2 || e != 2 || u != 0 {
				t.Fatalf("Middleware ran %d times, OnMessage %d times (%d without the Middleware's context); want 2, 2, 0", s, e, u)
			}
		})
	}
}

package kafkapubsub_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// warnings counts WARN records whose message contains a text, to know
// when a Subscriber has started waiting.
type warnings struct {
	slog.Handler
	text string
	n    *atomic.Int64
}

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || w.Handler.Enabled(ctx, l)
}

func (w warnings) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, w.text) {
		w.n.Add(1)
	}
	if !w.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return w.Handler.Handle(ctx, r)
}

func (w warnings) WithAttrs(as []slog.Attr) slog.Handler {
	return warnings{w.Handler.WithAttrs(as), w.text, w.n}
}

func (w warnings) WithGroup(g string) slog.Handler {
	return warnings{w.Handler.WithGroup(g), w.text, w.n}
}

// A Subscriber started before its topic exists says so at WARN, and
// consumes once the topic is created.
func TestSubscribeBeforeTopicExists(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Name("late")
	group := kafkatest.Name("g")
	var warned atomic.Int64
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: group, SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second,
		Logger: slog.New(warnings{quietLogger().Handler(), "topic does not exist", &warned}),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	c := kafkatest.Client(t)
	// Until the Subscriber either waits for the topic or has joined its group.
	testenv.WaitFor(t, time.Minute, "the subscriber to wait for the topic or to join its group", func() bool {
		if warned.Load() > 0 {
			return true
		}
		res, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		return err == nil && len(res.Groups) == 1 && res.Groups[0].GroupState == "Stable"
	})
	kafkatest.CreateTopic(t, topic, 1)
	var mu sync.Mutex
	got := map[string]bool{}
	go func() {
		for m := range ch {
			mu.Lock()
			got[string(m.Payload)] = true
			mu.Unlock()
			m.Ack()
		}
	}()
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer wr.Close()
	if err := wr.WriteMessages(ctx, kafka.Message{Value: []byte("one")}, kafka.Message{Value: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both records to be delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["one"] && got["two"]
	})
}

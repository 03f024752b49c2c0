package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A record the broker refuses for good (a record without a key on a
// compacted topic) is the message's fault: it goes DEAD after MaxAttempts,
// and is not retried for ever as an outage.
func TestKeylessRecordOnCompactedTopicGoesDead(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	f := newFixture(t, 1)
	ctx := context.Background()
	topic := kafkatest.Name("compact")
	c := kafkatest.Client(t)
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}},
	}}})
	if err != nil || res.Errors[topic] != nil {
		t.Fatalf("create %s: %v %v", topic, err, res.Errors)
	}
	t.Cleanup(func() {
		_, _ = c.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
	kafkatest.CreateTopic(t, topic, 1) // waits for its leader
	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.w.WriteTx(ctx, tx, topic, message.NewMessage("0190a0e8-0000-7000-8000-0000000000aa", []byte("no key"))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var unavailable atomic.Int64
	r := f.relay(t, f.pub, &outbox.RelayConfig{MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) {
			unavailable.Add(int64(ev.Unavailable))
		})})
	runRelay(t, r)
	testenv.WaitFor(t, 2*time.Minute, "four failed attempts, or a DEAD row", func() bool {
		var attempts, deadRows int
		_ = f.db.Pool.QueryRow(ctx, "SELECT max(attempts), count(*) FILTER (WHERE status = 'DEAD') FROM "+
			f.db.Table("exactly_outbox")).Scan(&attempts, &deadRows)
		return attempts >= 4 || deadRows > 0
	})
	var status, lastErr string
	if err := f.db.Pool.QueryRow(ctx, "SELECT status, coalesce(last_error, '') FROM "+f.db.Table("exactly_outbox")).Scan(&status, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "DEAD" {
		t.Fatalf("status %s after MaxAttempts (unavailable %d), last error %q: a refused record retried as an outage", status, unavailable.Load(), lastErr)
	}
}

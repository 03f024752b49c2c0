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

// The relay's verdict on a publish the broker refuses: the message's fault
// (DEAD after MaxAttempts) or the infrastructure's (retried, never DEAD).

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
	f.commitOne(t, topic, message.NewMessage("0190a0e8-0000-7000-8000-0000000000aa", []byte("no key")))
	unavailable, _, _ := f.relayUntilRefused(t)
	var status, lastErr string
	if err := f.db.Pool.QueryRow(ctx, "SELECT status, coalesce(last_error, '') FROM "+f.db.Table("exactly_outbox")).Scan(&status, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "DEAD" {
		t.Fatalf("status %s after MaxAttempts (unavailable %d), last error %q: a refused record retried as an outage", status, unavailable, lastErr)
	}
}

// An event for a topic that does not exist yet (the API deployed before the
// worker that creates the topics) is the infrastructure's failure: it is
// retried past MaxAttempts, never DEAD, counted as unavailable, and once
// the topic exists it is published, once, with the events behind it.
// Before, it went DEAD after MaxAttempts and held its key for good.
func TestMissingTopicNeverDead(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	f := newFixture(t, 1)
	ctx := context.Background()
	topic := kafkatest.Name("later")
	var msgs []*message.Message
	for _, id := range []string{"0190a0e8-0000-7000-8000-000000000001", "0190a0e8-0000-7000-8000-000000000002"} {
		m := message.NewMessage(id, []byte(id))
		m.Metadata.Set(outbox.KeyMetadata, "k")
		msgs = append(msgs, m)
	}
	f.commitOne(t, topic, msgs...)
	unavailable, dead, r := f.relayUntilRefused(t)
	st, err := r.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dead != 0 || dead != 0 || unavailable < 4 {
		t.Fatalf("dead rows %d, dead events %d, unavailable %d: want 0, 0, at least 4", st.Dead, dead, unavailable)
	}
	kafkatest.CreateTopic(t, topic, 1)
	testenv.WaitFor(t, 2*time.Minute, "both events published", func() bool {
		st, err := r.Stats(ctx)
		return err == nil && st.Pending == 0 && st.Dead == 0
	})
	got := kafkatest.ReadAll(t, topic, 1, time.Minute)
	if len(got) != 2 || string(got[0].Value) != msgs[0].UUID || string(got[1].Value) != msgs[1].UUID {
		t.Fatalf("%d records on the topic, want the two events in order", len(got))
	}
}

// relayUntilRefused runs a relay with MaxAttempts 2 until a row failed
// four attempts or went DEAD, and returns the relay and what its hooks
// counted: attempts refused as unavailable, rows gone DEAD.
func (f *fixture) relayUntilRefused(t *testing.T) (unavailable, dead int64, r *outbox.Relay) {
	t.Helper()
	var unav, deadN atomic.Int64
	r = f.relay(t, f.pub, &outbox.RelayConfig{MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) {
			unav.Add(int64(ev.Unavailable))
			deadN.Add(int64(ev.Dead))
		})})
	runRelay(t, r)
	testenv.WaitFor(t, 2*time.Minute, "four failed attempts, or a DEAD row", func() bool {
		var attempts, deadRows int
		_ = f.db.Pool.QueryRow(context.Background(), "SELECT max(attempts), count(*) FILTER (WHERE status = 'DEAD') FROM "+
			f.db.Table("exactly_outbox")).Scan(&attempts, &deadRows)
		return attempts >= 4 || deadRows > 0
	})
	return unav.Load(), deadN.Load(), r
}

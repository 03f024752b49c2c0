package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
)

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
	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for _, id := range []string{"0190a0e8-0000-7000-8000-000000000001", "0190a0e8-0000-7000-8000-000000000002"} {
		m := message.NewMessage(id, []byte(id))
		m.Metadata.Set(outbox.KeyMetadata, "k")
		msgs = append(msgs, m)
	}
	if err := f.w.WriteTx(ctx, tx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var unavailable, dead atomic.Int64
	r := f.relay(t, f.pub, &outbox.RelayConfig{MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Hooks: outbox.HooksFunc(func(_ context.Context, ev outbox.BatchEvent) {
			unavailable.Add(int64(ev.Unavailable))
			dead.Add(int64(ev.Dead))
		})})
	runRelay(t, r)
	testenv.WaitFor(t, 2*time.Minute, "four failed attempts, or a DEAD row", func() bool {
		var attempts, deadRows int
		_ = f.db.Pool.QueryRow(ctx, "SELECT max(attempts), count(*) FILTER (WHERE status = 'DEAD') FROM "+
			f.db.Table("exactly_outbox")).Scan(&attempts, &deadRows)
		return attempts >= 4 || deadRows > 0
	})
	st, err := r.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dead != 0 || dead.Load() != 0 || unavailable.Load() < 4 {
		t.Fatalf("dead rows %d, dead events %d, unavailable %d: want 0, 0, at least 4", st.Dead, dead.Load(), unavailable.Load())
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

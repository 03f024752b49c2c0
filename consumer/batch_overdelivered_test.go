package consumer_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
)

// In batch mode too, a message that its Subscriber says was delivered more
// than twice MaxAttempts times across every member (a share group's
// command whose handler kills its process) is dead-lettered without running
// its handler; the messages around it are applied.
func TestBatchOverDeliveredIsDeadLettered(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	f := newFakeMsgs(6, func(i int) string { return "acc" })
	poison := f.msgs[3]
	poison.SetContext(dedupe.ContextWithDeliveries(poison.Context(), 5))
	var mu sync.Mutex
	ran := map[string]bool{}
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		for _, m := range msgs {
			mu.Lock()
			ran[m.UUID] = true
			mu.Unlock()
			if err := w.apply(ctx, tx, m); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	pub := &recordingPublisher{}
	c, err := consumer.NewBatchConsumer(w.store, handler, &consumer.BatchConfig{
		Config:  consumer.Config{Scope: "ledger", MaxAttempts: 2, Logger: quietLogger()},
		MaxSize: 10, Publisher: pub, DeadLetterTopic: "dlq",
	})
	if err != nil {
		t.Fatal(err)
	}
	acked, nacked := f.run(t, c)
	if len(acked) != 6 || len(nacked) != 0 {
		t.Fatalf("acked %v, nacked %v; want all acked", acked, nacked)
	}
	if ran[poison.UUID] {
		t.Errorf("the handler ran the over-delivered message")
	}
	dead := pub.get("dlq")
	if len(dead) != 1 || dead[0].UUID != poison.UUID {
		t.Fatalf("dead letters %d, want the over-delivered message alone", len(dead))
	}
	if n := w.applied(); n != 5 {
		t.Errorf("%d messages applied, want 5", n)
	}
}

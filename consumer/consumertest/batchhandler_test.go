package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/consumer/consumertest"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// batchStores are the stores a batch handler is tested on: in memory, and
// a real pgstore.Store (when a database is configured). Both must answer
// alike.
func batchStores(t *testing.T) map[string]consumertest.BatchStore {
	stores := map[string]consumertest.BatchStore{"mem": consumertest.NewMemStore(nil)}
	if testing.Short() {
		return stores
	}
	db := pgtest.New(t)
	ps, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	stores["postgres"] = ps
	return stores
}

// TestBatchHandlerAppliesOnce: a batch handler under the kit runs once per
// key: a redelivered batch is all duplicates with the stored outputs, a
// key repeated in a batch is a duplicate of its first copy, a key reused
// with another payload is refused (nacked: no dead-letter topic), and a
// message the handler refuses with a MessageError is nacked while the
// rest of its batch is applied. The same on MemStore and on Postgres.
func TestBatchHandlerAppliesOnce(t *testing.T) {
	t.Parallel()
	for name, store := range batchStores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var runs atomic.Int64
			applied := map[string]int{}
			h, err := consumertest.NewBatchHandler(store, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
				outs := make([][]*message.Message, len(msgs))
				for i, m := range msgs {
					if m.Metadata.Get("refuse") != "" {
						return nil, &consumer.MessageError{Index: i, Err: dedupe.Permanent(errors.New("refused"))}
					}
				}
				for i, m := range msgs {
					runs.Add(1)
					applied[m.UUID]++
					outs[i] = []*message.Message{message.NewMessage("", []byte("done "+string(m.Payload)))}
				}
				return outs, nil
			}, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger-" + name, MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler)}})
			if err != nil {
				t.Fatal(err)
			}
			msg := func(id, payload string) *message.Message { return message.NewMessage(id, []byte(payload)) }
			first := []*message.Message{msg("k1", "a"), msg("k2", "b"), msg("k1", "a"), msg("k3", "c")}
			rs := h.Run(ctx, t, first...)
			want := []consumer.Outcome{consumer.OutcomeApplied, consumer.OutcomeApplied, consumer.OutcomeDuplicate, consumer.OutcomeApplied}
			for i, r := range rs {
				if r.Outcome != want[i] || !r.Acked || !r.Stored {
					t.Errorf("first batch, message %d: %s acked %v stored %v (%v), want %s acked and stored", i, r.Outcome, r.Acked, r.Stored, r.Err, want[i])
				}
			}
			if got := fmt.Sprint(rs[2].StoredOutputs[0].Payload); got != fmt.Sprint([]byte("done a")) {
				t.Errorf("the in-batch duplicate's stored outputs: %q", rs[2].StoredOutputs[0].Payload)
			}
			again := []*message.Message{msg("k1", "a"), msg("k2", "b"), msg("k3", "c")}
			for i, r := range h.Run(ctx, t, again...) {
				if r.Outcome != consumer.OutcomeDuplicate || !r.Acked {
					t.Errorf("redelivery, message %d: %s acked %v (%v), want a duplicate, acked", i, r.Outcome, r.Acked, r.Err)
				}
			}
			refused := msg("k5", "e")
			refused.Metadata.Set("refuse", "1")
			rs = h.Run(ctx, t, msg("k2", "changed"), msg("k4", "d"), refused)
			if r := rs[0]; r.Outcome != consumer.OutcomeKeyReused || r.Acked {
				t.Errorf("a reused key: %s acked %v (%v), want key_reused, nacked", r.Outcome, r.Acked, r.Err)
			}
			if r := rs[1]; r.Outcome != consumer.OutcomeApplied || !r.Acked || !r.Stored {
				t.Errorf("the message beside the refused ones: %s acked %v stored %v (%v)", r.Outcome, r.Acked, r.Stored, r.Err)
			}
			if r := rs[2]; r.Acked || r.Stored || !dedupe.IsPermanent(r.Err) {
				t.Errorf("the refused message: %s acked %v stored %v (%v), want nacked, no key, a permanent error", r.Outcome, r.Acked, r.Stored, r.Err)
			}
			for id, n := range applied {
				if n != 1 {
					t.Errorf("%s applied %d times, want once", id, n)
				}
			}
			if runs.Load() != 4 {
				t.Errorf("the handler ran for %d messages, want 4 (k1 k2 k3 k4)", runs.Load())
			}
		})
	}
}

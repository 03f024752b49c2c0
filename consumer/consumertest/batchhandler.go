package consumertest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
)

// BatchStore is what a [BatchHandler] runs on: the batch consumer's
// [consumer.BatchStore], and Get to read a key back. [*pgstore.Store] and
// [*MemStore] implement it.
type BatchStore interface {
	consumer.BatchStore
	Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error)
}

var _ BatchStore = (*MemStore)(nil)

// BatchHandler runs a batch handler through a real [consumer.BatchConsumer]:
// the messages of one Run are one delivery, batched as the consumer batches
// a Subscriber's (up to BatchConfig.MaxSize at a time), with the
// per-message path for the messages a batch cannot take.
type BatchHandler struct {
	store BatchStore
	c     *consumer.BatchConsumer
}

// BatchResult is what one message of a batch did: its [Result] (Err is the
// error of its Event), and whether the consumer acked it (false: nacked,
// for the Subscriber to deliver again).
type BatchResult struct {
	Result
	Acked bool
}

// NewBatchHandler returns a BatchHandler for h on store with cfg. cfg may
// be nil; an empty cfg.Scope becomes [DefaultScope]; cfg.Hooks still gets
// every event.
func NewBatchHandler(store BatchStore, h consumer.BatchHandlerFunc, cfg *consumer.BatchConfig) (*BatchHandler, error) {
	if h == nil {
		return nil, errors.New("consumertest: NewBatchHandler: handler is nil")
	}
	var c consumer.BatchConfig
	if cfg != nil {
		c = *cfg
	}
	capture(&c.Config)
	bc, err := consumer.NewBatchConsumer(store, h, &c)
	if err != nil {
		return nil, err
	}
	return &BatchHandler{store: store, c: bc}, nil
}

// Run delivers msgs to the batch consumer in order, with ctx as their
// context, waits until it acked or nacked each, then reads their keys back
// from the store. It fails t when a key cannot be read back.
func (h *BatchHandler) Run(ctx context.Context, t testing.TB, msgs ...*message.Message) []BatchResult {
	t.Helper()
	rs, err := h.run(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func (h *BatchHandler) run(ctx context.Context, msgs []*message.Message) ([]BatchResult, error) {
	ch := make(chan *message.Message, len(msgs))
	slots := make([]*eventSlot, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return nil, fmt.Errorf("consumertest: Run: message %d is nil", i)
		}
		slots[i] = new(eventSlot)
		msg.SetContext(context.WithValue(ctx, runKey{}, slots[i]))
		ch <- msg
	}
	close(ch)
	if err := h.c.Run(ctx, ch); err != nil {
		return nil, err
	}
	out := make([]BatchResult, len(msgs))
	for i, msg := range msgs {
		msg.SetContext(ctx)
		ev := slots[i].get()
		select {
		case <-msg.Acked():
			out[i].Acked = true
		case <-msg.Nacked():
		default:
			return nil, fmt.Errorf("consumertest: message %s was neither acked nor nacked (ctx ended?)", msg.UUID)
		}
		r := Result{Outcome: ev.Outcome, Err: ev.Err, Event: ev, Key: dedupe.Key{Scope: ev.Scope, ID: ev.Key}}
		if err := readBack(ctx, h.store, &r); err != nil {
			return nil, err
		}
		out[i].Result = r
	}
	return out, nil
}

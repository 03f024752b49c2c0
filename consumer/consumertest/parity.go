package consumertest

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/consumer"
)

// ParityConfig is what [BatchParity] runs: a batch handler on a store,
// the state it writes, and how to start that state afresh.
type ParityConfig struct {
	// Store is where the keys are claimed: a [*pgstore.Store] for a
	// handler that writes SQL. Required.
	Store BatchStore
	// Handler is the batch handler under test. Required.
	Handler consumer.BatchHandlerFunc
	// Config is the batch consumer's configuration. Its Scope is suffixed
	// with "/batched" and "/one-by-one" for the two runs, so that neither
	// finds the other's keys. Defaults to [DefaultScope] and the batch
	// consumer's defaults (MaxSize 100).
	Config *consumer.BatchConfig
	// Reset brings the handler's state back to where it starts, before
	// each run (a TRUNCATE and the fixtures, say). Required.
	Reset func(ctx context.Context) error
	// State reads the handler's state after each run (the balances, say),
	// as a value that reflect.DeepEqual compares. Required.
	State func(ctx context.Context) (any, error)
}

// BatchParity applies msgs with cfg.Handler twice, each time on the
// state cfg.Reset prepares: first as one delivery (batched up to
// BatchConfig.MaxSize, as a Subscriber's messages are), then one message
// per batch, which applies each message as a per-message handler would.
// It returns an error naming both states when cfg.State differs after the
// two runs, or when a message was not acked in either.
//
// It catches the batch statement that applies a target row once per
// statement instead of once per message: an "UPDATE … FROM unnest(…)"
// with a source row per message, where two messages for one row (two
// payments to one account) update it once, and the other is lost, with
// its key stored (docs/batch.md, "One source row per target row"). Give
// it messages that touch the same rows:
//
//	err := consumertest.BatchParity(ctx, &consumertest.ParityConfig{
//		Store: store, Handler: handleBatch,
//		Reset: func(ctx context.Context) error { _, err := pool.Exec(ctx, "TRUNCATE accounts"); return err },
//		State: func(ctx context.Context) (any, error) { return balances(ctx, pool) },
//	}, pay("a", 100), pay("a", 100), pay("b", 5))
//	if err != nil {
//		t.Fatal(err)
//	}
func BatchParity(ctx context.Context, cfg *ParityConfig, msgs ...*message.Message) error {
	switch {
	case cfg == nil || cfg.Store == nil || cfg.Handler == nil:
		return errors.New("consumertest: BatchParity: ParityConfig.Store and Handler are required")
	case cfg.Reset == nil || cfg.State == nil:
		return errors.New("consumertest: BatchParity: ParityConfig.Reset and State are required: " +
			"Reset starts the handler's state afresh, State reads it")
	}
	var bc consumer.BatchConfig
	if cfg.Config != nil {
		bc = *cfg.Config
	}
	capture(&bc.Config)
	scope := bc.Scope
	run := func(name string, deliveries [][]*message.Message) (any, error) {
		if err := cfg.Reset(ctx); err != nil {
			return nil, fmt.Errorf("consumertest: BatchParity: reset before the %s run: %w", name, err)
		}
		c := bc
		c.Scope = scope + "/" + name
		h, err := NewBatchHandler(cfg.Store, cfg.Handler, &c)
		if err != nil {
			return nil, err
		}
		for _, d := range deliveries {
			rs, err := h.run(ctx, d)
			if err != nil {
				return nil, err
			}
			for i, r := range rs {
				if !r.Acked {
					return nil, fmt.Errorf("consumertest: BatchParity: the %s run did not apply message %s: %s, %v",
						name, d[i].UUID, r.Outcome, r.Err)
				}
			}
		}
		st, err := cfg.State(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumertest: BatchParity: state after the %s run: %w", name, err)
		}
		return st, nil
	}
	copies := func() []*message.Message {
		out := make([]*message.Message, len(msgs))
		for i, m := range msgs {
			out[i] = m.Copy()
		}
		return out
	}
	batched, err := run("batched", [][]*message.Message{copies()})
	if err != nil {
		return err
	}
	var ones [][]*message.Message
	for _, m := range copies() {
		ones = append(ones, []*message.Message{m})
	}
	alone, err := run("one-by-one", ones)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(batched, alone) {
		return fmt.Errorf("consumertest: BatchParity: the batch left %v, one message at a time left %v: "+
			"the handler applies some messages differently in a batch (a statement with two source rows for "+
			"one target row updates it once: aggregate per target row first, see docs/batch.md)", batched, alone)
	}
	return nil
}

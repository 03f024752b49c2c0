package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// BatchHandlerFunc applies a batch of messages in tx, set-based, and
// returns nil or one slice of output messages per message (outputs[i]
// belongs to msgs[i], and is stored as its result for its duplicates, or
// written to the outbox with BatchConfig.Outputs; an output without a
// context of its own gets msgs[i]'s). msgs holds only the
// messages to apply: duplicates and key reuses are filtered out before, and
// each partition's messages are in offset order. An error rolls the whole
// batch back; the batch is then split to find the failing message (unless
// the failure is the infrastructure's, BatchConfig.Timeout's included). The
// same function runs with a single message on the per-message path.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) (outputs [][]*message.Message, err error)

// MessageError is what a BatchHandlerFunc returns when it knows which
// message of the batch is at fault (a payload it cannot parse, say), or
// several of them joined with errors.Join. When every such Err is permanent
// ([dedupe.IsPermanent]), the batch is cut at each of them: the messages
// between them are applied as batches, and each takes the per-message path
// alone in its place (to the dead-letter topic), so that it is decided as
// one message at a time would decide it (before a later copy of its key is
// stored, say). Otherwise the batch is cut at the first only: the messages
// before it are applied as a batch, it takes the per-message path alone
// (retried, counted towards MaxAttempts), then the messages after it are
// applied.
type MessageError struct {
	// Index is the message's index in the handler's msgs.
	Index int
	Err   error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("consumer: message %d of the batch: %v", e.Index, e.Err)
}

// Unwrap returns Err.
func (e *MessageError) Unwrap() error { return e.Err }

// BatchConfig configures a BatchConsumer.
type BatchConfig struct {
	// Config is the middleware's configuration, for the batch path and the
	// per-message path alike: Scope (required: a batch consumer runs
	// outside a router and has no handler name), AcrossTopics, KeyFunc,
	// FingerprintFunc, MissingKey, TTL, Outputs, MaxAttempts, Hooks,
	// LogDuplicates, Logger and Source. Hooks receives one Event per
	// message; on the batch path its Duration is the batch's. Lease must be
	// 0: a batch runs in one transaction.
	Config

	// MaxSize bounds a batch's messages. Defaults to 100.
	MaxSize int
	// MaxWait bounds how long a batch waits for more messages after its
	// first one arrived. Defaults to 10ms.
	MaxWait time.Duration
	// Workers is how many batches may run at once. Each partition belongs
	// to one worker (partition modulo Workers), so its messages stay in
	// order; a message without Kafka coordinates goes to the first.
	// Defaults to 1.
	Workers int

	// Publisher publishes the handler's outputs to OutputTopic when Outputs
	// is nil (and a duplicate's stored outputs again, with their UUIDs), and
	// dead letters to DeadLetterTopic. Defaults to nil: outputs are
	// dropped, and DeadLetterTopic must be empty.
	Publisher   message.Publisher
	OutputTopic string
	// DeadLetterTopic receives the messages that fail for good (key reused,
	// invalid key or payload, poison), with the reason in metadata
	// "reason_poisoned", through a middleware.PoisonQueue with
	// dedupe.IsPermanent as filter. Defaults to "": such messages are nacked
	// and held, as without a PoisonQueue (logged at ERROR).
	DeadLetterTopic string
	// PerMessage is the middleware around the dedupe Middleware on the
	// per-message path, outermost first, as on a router: the path a
	// message takes when its batch failed and splitting isolated it, or when
	// it has no valid key or fingerprint, or its key was reused. Defaults to
	// the PoisonQueue for DeadLetterTopic (when set), a middleware.Retry
	// with ShouldRetry and ResetContextOnRetry (3 retries from 50ms), and a
	// middleware.Timeout of Timeout. A PerMessage of your own should end
	// with a middleware.Timeout too: nothing else bounds that path.
	PerMessage []message.HandlerMiddleware
	// Timeout bounds one batch attempt: claims, handler and commit. A
	// connection whose peer is silently gone blocks a database call until
	// its context ends. An attempt cut by Timeout while its handler waited
	// for the database (a lock, the disk) counts as an outage, not as the
	// messages' fault (nacked, the batch whole, delivered again, never
	// split or dead-lettered for it); one cut while its handler ran the
	// messages' own work is split, and the slow message's cuts count
	// towards MaxAttempts on the per-message path (see the package doc's
	// "Poison messages and outages"). Set it above the slowest batch's
	// time.
	// Defaults to 30s.
	Timeout time.Duration
}

// BatchConsumer is batch mode: it reads messages from a Subscriber's
// channel, groups them into batches (bounded by BatchConfig.MaxSize and
// MaxWait; each partition's messages contiguous and in order), and applies
// each batch in one transaction with [pgstore.Store.DoBatch]: every key
// claimed in one statement, the handler run once on the fresh messages,
// one commit; then every message of the batch is acked. See the package
// doc's "Batch mode".
type BatchConsumer struct {
	store   BatchStore
	handler BatchHandlerFunc
	cfg     BatchConfig
	// mw is the dedupe Middleware of the per-message path; the batch path
	// takes its keys, fingerprints and coordinates as it does.
	mw *Middleware
	// single is the per-message path: the PerMessage middleware around the
	// dedupe Middleware around the handler on one message.
	single message.HandlerFunc
}

// NewBatchConsumer returns a batch consumer that applies batches with
// handler on store: a [*pgstore.Store], or consumertest.MemStore in unit
// tests.
func NewBatchConsumer(store BatchStore, handler BatchHandlerFunc, cfg *BatchConfig) (*BatchConsumer, error) {
	if isNil(store) {
		return nil, errors.New("consumer: NewBatchConsumer: store is nil")
	}
	if handler == nil {
		return nil, errors.New("consumer: NewBatchConsumer: handler is nil")
	}
	var c BatchConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxSize == 0 {
		c.MaxSize = 100
	}
	if c.MaxWait == 0 {
		c.MaxWait = 10 * time.Millisecond
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	switch {
	case c.Scope == "":
		return nil, errors.New("consumer: BatchConfig.Scope is empty: set it to the handler's stable name")
	case c.MaxSize < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.MaxSize is %d: set 1 or more, or 0 for the default", c.MaxSize)
	case c.Workers < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.Workers is %d: set 1 or more, or 0 for the default", c.Workers)
	case c.MaxWait < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.MaxWait is %v: set a positive duration, or 0 for the default", c.MaxWait)
	case c.Timeout < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.Timeout is %v: set a positive duration, or 0 for the default", c.Timeout)
	case c.DeadLetterTopic != "" && c.Publisher == nil:
		return nil, errors.New("consumer: BatchConfig.DeadLetterTopic needs a Publisher: set BatchConfig.Publisher")
	case c.OutputTopic != "" && c.Publisher == nil:
		return nil, errors.New("consumer: BatchConfig.OutputTopic needs a Publisher: set BatchConfig.Publisher")
	case c.Lease != 0:
		return nil, errors.New("consumer: BatchConfig.Lease is set: a batch runs in one transaction; leave it at 0")
	}
	mw, err := NewMiddleware(store, &c.Config)
	if err != nil {
		return nil, err
	}
	// The middleware's defaults are the batch path's too.
	c.Config = mw.cfg
	if c.PerMessage == nil {
		if c.PerMessage, err = DefaultPerMessage(&c); err != nil {
			return nil, err
		}
	}
	bc := &BatchConsumer{store: store, handler: handler, cfg: c, mw: mw}
	one := TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		outs, err := bc.call(ctx, tx, []*message.Message{msg})
		if err != nil || len(outs) == 0 {
			return nil, alone(err)
		}
		return outs[0], nil
	})
	h := mw.Middleware(middleware.Recoverer(one))
	for i := len(c.PerMessage) - 1; i >= 0; i-- {
		h = c.PerMessage[i](h)
	}
	bc.single = h
	return bc, nil
}

// DefaultPerMessage returns the middleware of the per-message path that
// NewBatchConsumer uses when cfg.PerMessage is nil, outermost first: the
// PoisonQueue for cfg.DeadLetterTopic (when set, on cfg.Publisher), a
// middleware.Retry with ShouldRetry and ResetContextOnRetry (3 retries from
// 50ms), and a middleware.Timeout of cfg.Timeout (30s when 0). Append to it
// to add middleware of your own inside the defaults.
func DefaultPerMessage(cfg *BatchConfig) ([]message.HandlerMiddleware, error) {
	var chain []message.HandlerMiddleware
	if cfg.DeadLetterTopic != "" {
		if cfg.Publisher == nil {
			return nil, errors.New("consumer: BatchConfig.DeadLetterTopic needs a Publisher: set BatchConfig.Publisher")
		}
		poison, err := middleware.PoisonQueueWithFilter(cfg.Publisher, cfg.DeadLetterTopic, dedupe.IsPermanent)
		if err != nil {
			return nil, fmt.Errorf("consumer: dead-letter queue: %w", err)
		}
		chain = append(chain, poison)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2,
		ShouldRetry: ShouldRetry, ResetContextOnRetry: true}
	return append(chain, retry.Middleware, middleware.Timeout(timeout)), nil
}

// Check verifies the store's table (pgstore.Store.Check), as
// Middleware.Check does.
func (c *BatchConsumer) Check(ctx context.Context) error { return c.store.Check(ctx) }

// Subscribe subscribes to topic on sub and runs the consumer on its
// messages until ctx is done or the subscription ends.
func (c *BatchConsumer) Subscribe(ctx context.Context, sub message.Subscriber, topic string) error {
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return fmt.Errorf("consumer: subscribe to %s: %w", topic, err)
	}
	return c.Run(ctx, msgs)
}

// Run consumes msgs, batch after batch, until ctx is done or msgs is
// closed. Messages of an unfinished batch are neither acked nor nacked
// when ctx ends: the Subscriber delivers them again.
func (c *BatchConsumer) Run(ctx context.Context, msgs <-chan *message.Message) error {
	if c.cfg.Workers == 1 {
		c.loop(ctx, msgs)
		return nil
	}
	// Each partition belongs to one worker, so its messages stay in order.
	lanes := make([]chan *message.Message, c.cfg.Workers)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan *message.Message, c.cfg.MaxSize)
		wg.Add(1)
		go func() { defer wg.Done(); c.loop(ctx, lanes[i]) }()
	}
	defer func() {
		for _, l := range lanes {
			close(l)
		}
		wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			lane := 0
			if src, ok := c.source(m); ok {
				lane = int(uint32(src.Partition) % uint32(c.cfg.Workers))
			}
			select {
			case lanes[lane] <- m:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// loop forms batches from msgs and applies them, one at a time.
//
// A nacked message holds its partition back: the Subscriber's window may
// already have delivered later messages of that partition, and applying
// them before the nacked one comes back would break its key's order. So
// until the lowest nacked offset of a partition is delivered again, every
// later message of that partition is nacked unapplied (the window then
// delivers them again in offset order, after it). A hold that outlives
// holdTimeout is dropped: the partition has moved to another member, which
// went past the nacked message, and came back. A share group's record
// holds nothing: the group hands records out in no order.
func (c *BatchConsumer) loop(ctx context.Context, msgs <-chan *message.Message) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	type hold struct {
		offset int64 // the lowest nacked offset, not yet back
		since  time.Time
	}
	type partition struct {
		topic string
		n     int32
	}
	held := map[partition]hold{}
	admit := func(m *message.Message) bool {
		src, ok := c.source(m)
		if !ok {
			return true
		}
		p := partition{src.Topic, src.Partition}
		h, isHeld := held[p]
		switch {
		case !isHeld || src.Offset < h.offset:
			return true
		case src.Offset == h.offset || time.Since(h.since) > holdTimeout:
			delete(held, p)
			return true
		}
		m.Nack()
		return false
	}
	for {
		var batch []*message.Message
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			if admit(m) {
				batch = append(batch, m)
			}
		}
		if len(batch) == 0 {
			continue
		}
		timer.Reset(c.cfg.MaxWait)
		open := true
	fill:
		for len(batch) < c.cfg.MaxSize {
			select {
			case m, ok := <-msgs:
				if !ok {
					open = false
					break fill
				}
				if admit(m) {
					batch = append(batch, m)
				}
			case <-timer.C:
				break fill
			case <-ctx.Done():
				return
			}
		}
		timer.Stop()
		c.process(ctx, batch)
		for _, m := range batch {
			select {
			case <-m.Nacked():
			default:
				continue
			}
			if _, shared := dedupe.DeliveriesFromContext(m.Context()); shared {
				continue // a share group's record: no order to keep
			}
			if src, ok := c.source(m); ok {
				p := partition{src.Topic, src.Partition}
				if h, isHeld := held[p]; !isHeld || src.Offset < h.offset {
					held[p] = hold{offset: src.Offset, since: time.Now()}
				}
			}
		}
		if !open {
			return
		}
	}
}

// holdTimeout bounds how long a nacked message holds its partition back
// (see loop): far above the Subscriber's longest nack back-off.
const holdTimeout = time.Minute

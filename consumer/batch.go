package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/pgstore"
)

// BatchHandlerFunc applies a batch of messages in tx, set-based, and
// returns nil or one slice of output messages per message (outputs[i]
// belongs to msgs[i], and is stored as its result for its duplicates, or
// written to the outbox with BatchConfig.Outputs). msgs holds only the
// messages to apply: duplicates and key reuses are filtered out before, and
// each partition's messages are in offset order. An error rolls the whole
// batch back; the batch is then split to find the failing message. The
// same function runs with a single message on the per-message path.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) (outputs [][]*message.Message, err error)

// MessageError is what a BatchHandlerFunc returns when it knows which
// message of the batch is at fault (a payload it cannot parse, say), or
// several of them joined with errors.Join. When every such Err is permanent
// ([dedupe.IsPermanent]), the batch runs again without those messages and
// they take the per-message path at once (to the dead-letter topic: they
// are never applied, so their order does not matter). Otherwise the batch
// is cut at the first instead of split in halves: the messages before it
// are applied as a batch, it takes the per-message path alone (retried,
// counted towards MaxAttempts), then the messages after it are applied.
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
	// Scope names the consumer in every key, as Config.Scope does. Required:
	// a batch consumer runs outside a router and has no handler name.
	Scope string
	// KeyFunc, FingerprintFunc, MissingKey, TTL, Outputs, MaxAttempts,
	// Hooks, Logger and Source are the middleware's (see Config), for the
	// batch path and the per-message path alike. Hooks receives one Event
	// per message; on the batch path its Duration is the batch's.
	KeyFunc         KeyFunc
	FingerprintFunc dedupe.FingerprintFunc
	MissingKey      MissingKeyPolicy
	TTL             time.Duration
	Outputs         OutputsWriter
	MaxAttempts     int
	Hooks           Hooks
	Logger          *slog.Logger
	Source          func(msg *message.Message) (dedupe.Source, bool)

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
	// 30s middleware.Timeout.
	PerMessage []message.HandlerMiddleware

	// NoDedupe runs batches without claiming keys: each batch is applied in
	// a transaction of its own, and a redelivery applies it again. Only for
	// measurements (the cost of the claim). Defaults to false.
	NoDedupe bool
}

// BatchConsumer is batch mode: it reads messages from a Subscriber's
// channel, groups them into batches (bounded by BatchConfig.MaxSize and
// MaxWait; each partition's messages contiguous and in order), and applies
// each batch in one transaction with [pgstore.Store.DoBatch]: every key
// claimed in one statement, the handler run once on the fresh messages,
// one commit; then every message of the batch is acked. See the package
// doc's "Batch mode".
type BatchConsumer struct {
	store   *pgstore.Store
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
// handler on store.
func NewBatchConsumer(store *pgstore.Store, handler BatchHandlerFunc, cfg *BatchConfig) (*BatchConsumer, error) {
	if store == nil {
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
	switch {
	case c.Scope == "":
		return nil, errors.New("consumer: BatchConfig.Scope is empty: set it to the handler's stable name")
	case c.MaxSize < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.MaxSize is %d: set 1 or more, or 0 for the default", c.MaxSize)
	case c.Workers < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.Workers is %d: set 1 or more, or 0 for the default", c.Workers)
	case c.MaxWait < 0:
		return nil, fmt.Errorf("consumer: BatchConfig.MaxWait is %v: set a positive duration, or 0 for the default", c.MaxWait)
	case c.DeadLetterTopic != "" && c.Publisher == nil:
		return nil, errors.New("consumer: BatchConfig.DeadLetterTopic needs a Publisher: set BatchConfig.Publisher")
	case c.OutputTopic != "" && c.Publisher == nil:
		return nil, errors.New("consumer: BatchConfig.OutputTopic needs a Publisher: set BatchConfig.Publisher")
	}
	mw, err := NewMiddleware(store, &Config{Scope: c.Scope, KeyFunc: c.KeyFunc, FingerprintFunc: c.FingerprintFunc,
		MissingKey: c.MissingKey, TTL: c.TTL, Outputs: c.Outputs, MaxAttempts: c.MaxAttempts, Hooks: c.Hooks,
		Logger: c.Logger, Source: c.Source})
	if err != nil {
		return nil, err
	}
	// The middleware's defaults are the batch path's too.
	c.KeyFunc, c.FingerprintFunc, c.Logger = mw.cfg.KeyFunc, mw.cfg.FingerprintFunc, mw.cfg.Logger
	if c.PerMessage == nil {
		if c.DeadLetterTopic != "" {
			poison, err := middleware.PoisonQueueWithFilter(c.Publisher, c.DeadLetterTopic, dedupe.IsPermanent)
			if err != nil {
				return nil, fmt.Errorf("consumer: dead-letter queue: %w", err)
			}
			c.PerMessage = append(c.PerMessage, poison)
		}
		retry := middleware.Retry{MaxRetries: 3, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2,
			ShouldRetry: ShouldRetry, ResetContextOnRetry: true}
		c.PerMessage = append(c.PerMessage, retry.Middleware, middleware.Timeout(30*time.Second))
	}
	bc := &BatchConsumer{store: store, handler: handler, cfg: c, mw: mw}
	one := TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		outs, err := bc.call(ctx, tx, []*message.Message{msg})
		if err != nil || len(outs) == 0 {
			return nil, err
		}
		return outs[0], nil
	})
	var h message.HandlerFunc
	if c.NoDedupe {
		h = bc.plainOne
	} else {
		h = mw.Middleware(middleware.Recoverer(one))
	}
	for i := len(c.PerMessage) - 1; i >= 0; i-- {
		h = c.PerMessage[i](h)
	}
	bc.single = h
	return bc, nil
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
// went past the nacked message, and came back.
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

// item is one message of a batch with its claim request.
type item struct {
	msg *message.Message
	req dedupe.Request
	ev  Event
	// outs are the outputs to publish after the commit.
	outs []*message.Message
}

// process applies a batch. A message with no valid key or fingerprint
// splits it: the messages before it go first, then it alone on the
// per-message path, then the rest, so each partition's order holds.
func (c *BatchConsumer) process(ctx context.Context, batch []*message.Message) {
	start := time.Now()
	items := make([]item, 0, len(batch))
	for i, msg := range batch {
		it, ok := c.prepare(msg)
		if ok {
			items = append(items, it)
			continue
		}
		if c.apply(ctx, items, start) {
			nackAll(batch[i:])
			return
		}
		items = nil
		if !c.one(msg) {
			nackAll(batch[i+1:])
			return
		}
	}
	c.apply(ctx, items, start)
}

// prepare computes a message's key and fingerprint; false when it must
// take the per-message path (no valid key, or a payload that cannot be
// fingerprinted), where the middleware applies Config.MissingKey.
func (c *BatchConsumer) prepare(msg *message.Message) (item, bool) {
	it := item{msg: msg, ev: Event{Scope: c.cfg.Scope, Offset: -1}}
	src, hasSrc := c.source(msg)
	if hasSrc {
		it.ev.Topic, it.ev.Partition, it.ev.Offset = src.Topic, src.Partition, src.Offset
		it.req.Source = src
	}
	if c.cfg.NoDedupe {
		return it, true
	}
	key, err := c.mw.keyOf(msg, c.cfg.Scope)
	if err != nil {
		return it, false
	}
	fp, err := c.cfg.FingerprintFunc(msg.Payload)
	if err != nil {
		return it, false
	}
	it.ev.Key = key.ID
	it.req.Key, it.req.Fingerprint, it.req.TTL = key, fp, c.cfg.TTL
	return it, true
}

func (c *BatchConsumer) source(msg *message.Message) (dedupe.Source, bool) { return c.mw.source(msg) }

// apply applies items as one batch, splitting it in halves when it fails
// because of its messages, until the failing one is alone and takes the
// per-message path. It reports whether it stopped: a message was nacked,
// and so were the messages after it (they come back after it, in order).
func (c *BatchConsumer) apply(ctx context.Context, items []item, start time.Time) (stopped bool) {
	if len(items) == 0 {
		return false
	}
	answers, err := c.runBatch(ctx, items)
	if err == nil {
		return c.finish(ctx, items, answers, start)
	}
	if ctx.Err() != nil || errors.Is(err, dedupe.ErrMisconfigured) || pgstore.IsConfigurationError(err) ||
		dedupe.IsRetryable(err) || pgstore.IsRetryableError(err) {
		// Not the messages' fault: they all come back.
		level := slog.LevelWarn
		if errors.Is(err, dedupe.ErrMisconfigured) {
			level = slog.LevelError
		}
		c.cfg.Logger.Log(ctx, level, "consumer: batch failed; its messages will be delivered again", "messages", len(items), "err", err)
		nackItems(items)
		return true
	}
	if len(items) == 1 {
		return !c.one(items[0].msg)
	}
	bad := messageErrors(err, len(items))
	if len(bad) > 0 && allPermanent(bad) {
		// The messages at fault can never be applied, so their order does
		// not matter: the others go again as one batch without them, and
		// they take the per-message path (to the dead-letter topic).
		c.cfg.Logger.DebugContext(ctx, "consumer: batch failed because of messages that cannot be applied; applying it without them",
			"messages", len(items), "failed", len(bad), "err", err)
		var rest []item
		var out []*message.Message
		for i, it := range items {
			if _, ok := bad[i]; ok {
				out = append(out, it.msg)
			} else {
				rest = append(rest, it)
			}
		}
		stopped := c.apply(ctx, rest, time.Now())
		c.many(out)
		return stopped
	}
	if len(bad) > 0 {
		i := slices.Min(slices.Collect(maps.Keys(bad)))
		c.cfg.Logger.DebugContext(ctx, "consumer: batch failed because of one message; cutting it there", "messages", len(items), "err", err)
		if c.apply(ctx, items[:i], time.Now()) {
			nackItems(items[i:])
			return true
		}
		if !c.one(items[i].msg) {
			nackItems(items[i+1:])
			return true
		}
		return c.apply(ctx, items[i+1:], time.Now())
	}
	c.cfg.Logger.DebugContext(ctx, "consumer: batch failed; splitting it", "messages", len(items), "err", err)
	mid := len(items) / 2
	if c.apply(ctx, items[:mid], time.Now()) {
		nackItems(items[mid:])
		return true
	}
	return c.apply(ctx, items[mid:], time.Now())
}

// runBatch runs one batch transaction: DoBatch, or a plain transaction
// with NoDedupe.
func (c *BatchConsumer) runBatch(ctx context.Context, items []item) (answers []pgstore.BatchClaim, err error) {
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		msgs[i] = it.msg
	}
	outputs := make([][]*message.Message, len(items))
	if c.cfg.NoDedupe {
		err = c.plain(ctx, func(tx pgx.Tx) error {
			outs, err := c.call(ctx, tx, msgs)
			if err == nil {
				err = c.writeOutputs(ctx, tx, outs)
			}
			copy(outputs, outs)
			return err
		})
		if err != nil {
			return nil, err
		}
		answers = make([]pgstore.BatchClaim, len(items))
		for i := range answers {
			answers[i].Decision = dedupe.DecisionNew
		}
		c.keep(items, answers, outputs)
		return answers, nil
	}
	reqs := make([]dedupe.Request, len(items))
	for i, it := range items {
		reqs[i] = it.req
	}
	answers, err = c.store.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
		in := make([]*message.Message, len(fresh))
		for j, i := range fresh {
			in[j] = msgs[i]
		}
		outs, err := c.call(ctx, tx, in)
		if bad := messageErrors(err, len(fresh)); len(bad) > 0 {
			// Index the batch's items, not the handler's fresh messages.
			errs := make([]error, 0, len(bad))
			for _, j := range slices.Sorted(maps.Keys(bad)) {
				errs = append(errs, &MessageError{Index: fresh[j], Err: bad[j]})
			}
			return nil, errors.Join(errs...)
		}
		if err != nil {
			return nil, err
		}
		clear(outputs)
		for j, i := range fresh {
			if j < len(outs) {
				outputs[i] = outs[j]
			}
		}
		if c.cfg.Outputs != nil {
			// The outputs leave through the outbox with this transaction;
			// nothing is stored for duplicates, which publish nothing.
			return nil, c.writeOutputs(ctx, tx, outs)
		}
		results := make([][]byte, len(fresh))
		for j := range fresh {
			if j < len(outs) {
				if results[j], err = encodeOutputs(outs[j]); err != nil {
					return nil, err
				}
			}
		}
		return results, nil
	})
	if err != nil {
		return nil, err
	}
	c.keep(items, answers, outputs)
	return answers, nil
}

// keep remembers the outputs of the messages that ran, for finish.
func (c *BatchConsumer) keep(items []item, answers []pgstore.BatchClaim, outputs [][]*message.Message) {
	for i := range items {
		items[i].outs = nil
		if answers[i].Err == nil && answers[i].Decision.Run() && c.cfg.Outputs == nil {
			items[i].outs = outputs[i]
		}
	}
}

// call runs the handler on msgs, recovering a panic into an error, and
// checks the number of outputs.
func (c *BatchConsumer) call(ctx context.Context, tx pgx.Tx, msgs []*message.Message) (outs [][]*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("consumer: batch handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	outs, err = c.handler(ctx, tx, msgs)
	if err == nil && outs != nil && len(outs) != len(msgs) {
		err = fmt.Errorf("consumer: the batch handler returned %d output slices for %d messages: return nil or one per message", len(outs), len(msgs))
	}
	return outs, err
}

func (c *BatchConsumer) writeOutputs(ctx context.Context, tx pgx.Tx, outs [][]*message.Message) error {
	if c.cfg.Outputs == nil {
		return nil
	}
	var all []*message.Message
	for _, o := range outs {
		all = append(all, o...)
	}
	if len(all) == 0 {
		return nil
	}
	return c.cfg.Outputs.WriteOutputsTx(ctx, tx, all)
}

// finish publishes and acks a committed batch, in order. A message whose
// claim failed on its own (key reused, in flight) takes the per-message
// path, which dead-letters or retries it. It reports whether it stopped
// at a nacked message (the rest nacked too).
func (c *BatchConsumer) finish(ctx context.Context, items []item, answers []pgstore.BatchClaim, start time.Time) bool {
	d := time.Since(start)
	// The messages whose claim failed on its own were not applied: they
	// take the per-message path, all at once, once the others are done.
	var own []*message.Message
	defer func() { c.many(own) }()
	for i := range items {
		it, a := &items[i], answers[i]
		if a.Err != nil {
			own = append(own, it.msg)
			continue
		}
		outs := it.outs
		it.ev.Attempts, it.ev.Duration = a.Record.Attempts, d
		if a.Decision == dedupe.DecisionDuplicate {
			it.ev.Outcome = OutcomeDuplicate
			if c.cfg.Outputs == nil {
				var err error
				if outs, err = decodeOutputs(a.Record.Result); err != nil {
					c.cfg.Logger.ErrorContext(ctx, "consumer: duplicate's stored outputs unreadable", "key", it.ev.Key, "err", err)
				}
			}
		} else {
			it.ev.Outcome = OutcomeApplied
		}
		if err := c.publish(outs); err != nil {
			// The effects are committed: the redelivery is a duplicate and
			// publishes the stored outputs again.
			c.cfg.Logger.WarnContext(ctx, "consumer: publishing outputs failed; the message will be delivered again", "key", it.ev.Key, "err", err)
			it.ev.Err = err
			c.hook(ctx, it)
			it.msg.Nack()
			nackItems(items[i+1:])
			return true
		}
		c.hook(ctx, it)
		it.msg.Ack()
	}
	return false
}

func (c *BatchConsumer) hook(ctx context.Context, it *item) {
	if c.cfg.Hooks != nil {
		c.cfg.Hooks.OnMessage(ctx, it.ev)
	}
}

func (c *BatchConsumer) publish(outs []*message.Message) error {
	if len(outs) == 0 || c.cfg.Publisher == nil || c.cfg.OutputTopic == "" {
		return nil
	}
	return c.cfg.Publisher.Publish(c.cfg.OutputTopic, outs...)
}

// messageErrors collects the MessageErrors in err's tree (errors.Join of
// several, or one) whose Index is below n, by index.
func messageErrors(err error, n int) map[int]error {
	var found map[int]error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *MessageError:
			if e.Index >= 0 && e.Index < n {
				if found == nil {
					found = map[int]error{}
				}
				found[e.Index] = e.Err
			}
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return found
}

func allPermanent(errs map[int]error) bool {
	for _, err := range errs {
		if !dedupe.IsPermanent(err) {
			return false
		}
	}
	return true
}

// many takes msgs down the per-message path at once: messages that were not
// applied with their batch and never will be in it (key reused, in flight,
// a permanent error of their own), whose order does not matter.
func (c *BatchConsumer) many(msgs []*message.Message) {
	if len(msgs) == 0 {
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, m := range msgs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.one(m)
		}()
	}
	wg.Wait()
}

// one takes msg down the per-message path and acks or nacks it; it
// reports whether it acked.
func (c *BatchConsumer) one(msg *message.Message) bool {
	outs, err := c.single(msg)
	if err == nil {
		err = c.publish(outs)
	}
	if err != nil {
		msg.Nack()
		return false
	}
	msg.Ack()
	return true
}

// plainOne is the per-message path with NoDedupe.
func (c *BatchConsumer) plainOne(msg *message.Message) ([]*message.Message, error) {
	var outs [][]*message.Message
	err := c.plain(msg.Context(), func(tx pgx.Tx) error {
		var err error
		if outs, err = c.call(msg.Context(), tx, []*message.Message{msg}); err == nil {
			err = c.writeOutputs(msg.Context(), tx, outs)
		}
		return err
	})
	if err != nil || len(outs) == 0 || c.cfg.Outputs != nil {
		return nil, err
	}
	return outs[0], nil
}

// plain runs fn in a transaction with no keys.
func (c *BatchConsumer) plain(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer pgtx.Rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: commit: %w", err)
	}
	return nil
}

func nackAll(msgs []*message.Message) {
	for _, m := range msgs {
		m.Nack()
	}
}

func nackItems(items []item) {
	for _, it := range items {
		it.msg.Nack()
	}
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
	"github.com/exactly-go/exactly/internal/txguard"
)

// apply applies items as one batch, splitting it in halves when it fails
// because of its messages, until the failing one is alone and takes the
// per-message path. It reports whether it stopped: a message was nacked,
// and so were the messages after it (they come back after it, in order).
func (c *BatchConsumer) apply(ctx context.Context, items []item, start time.Time) (stopped bool) {
	if len(items) == 0 {
		return false
	}
	answers, err := c.attempt(ctx, items)
	if err == nil {
		return c.finish(ctx, items, answers, start)
	}
	var held *heldError
	if errors.As(err, &held) {
		// A key in flight before fresh messages: one at a time would wait
		// for it there, so the batch is cut there.
		c.cfg.Logger.DebugContext(ctx, "consumer: a key of the batch is claimed elsewhere; cutting the batch there",
			"messages", len(items), "key", items[held.index].ev.Key, "err", held.err)
		return c.cut(ctx, items, []int{held.index})
	}
	if outcome, ok := c.notTheirs(ctx, err); ok {
		// Not the messages' fault: they all come back, the batch whole.
		level := slog.LevelWarn
		if outcome == OutcomeMisconfigured {
			level = slog.LevelError
		}
		c.cfg.Logger.Log(ctx, level, "consumer: batch failed; its messages will be delivered again", "messages", len(items),
			"outcome", string(outcome), "err", err)
		d := time.Since(start)
		for i := range items {
			it := &items[i]
			it.ev.Outcome, it.ev.Err, it.ev.Duration = outcome, err, d
			c.hook(it)
		}
		nackItems(items)
		return true
	}
	if len(items) == 1 {
		return !c.one(items[0].msg)
	}
	bad := messageErrors(err, len(items))
	if len(bad) > 0 && allPermanent(bad) {
		// The messages at fault are decided where they are, as one at a
		// time would decide them: each alone on the per-message path (to
		// the dead-letter topic) after the messages before it and before
		// the messages after it, which go as batches between them. A later
		// copy of a key stored first would make its earlier copy a key
		// reuse instead of the invalid payload it is.
		c.cfg.Logger.DebugContext(ctx, "consumer: batch failed because of messages that cannot be applied; cutting it at each",
			"messages", len(items), "failed", len(bad), "err", err)
		return c.cut(ctx, items, slices.Sorted(maps.Keys(bad)))
	}
	if len(bad) > 0 {
		// Cut at the first: it may still succeed alone, and the messages
		// after it run again as a batch.
		c.cfg.Logger.DebugContext(ctx, "consumer: batch failed because of one message; cutting it there", "messages", len(items), "err", err)
		return c.cut(ctx, items, []int{slices.Min(slices.Collect(maps.Keys(bad)))})
	}
	c.cfg.Logger.DebugContext(ctx, "consumer: batch failed; splitting it", "messages", len(items), "err", err)
	mid := len(items) / 2
	if c.apply(ctx, items[:mid], time.Now()) {
		nackItems(items[mid:])
		return true
	}
	return c.apply(ctx, items[mid:], time.Now())
}

// heldError stops a batch transaction before its handler runs: the claim
// of the message at index found its key claimed elsewhere (a lease in
// flight), or could not be decided in the batch, and fresh messages come
// after it.
type heldError struct {
	index int
	err   error
}

func (e *heldError) Error() string {
	return fmt.Sprintf("consumer: message %d of the batch waits for its key: %v", e.index, e.err)
}

// heldAt returns the first claim that must be decided alone (its key in
// flight, or ErrClaimAlone) when a fresh message comes after it: applying
// that one first would overtake it.
func heldAt(claims []dedupe.BatchClaim, fresh []int) (*heldError, bool) {
	if len(fresh) == 0 {
		return nil, false
	}
	last := fresh[len(fresh)-1]
	for i := 0; i < last && i < len(claims); i++ {
		if err := claims[i].Err; err != nil && !dedupe.IsPermanent(err) {
			return &heldError{index: i, err: err}, true
		}
	}
	return nil, false
}

// notTheirs classifies a batch's failure as the Middleware classifies a
// message's: a configuration error, or a failure of the infrastructure (a
// transient database error, a lost or refused connection, a shutdown, an
// error the handler marked with dedupe.Retryable, or a database that does
// not answer a ping now). Such a failure is no message's fault: the batch
// is not split for it.
func (c *BatchConsumer) notTheirs(ctx context.Context, err error) (Outcome, bool) {
	var late *lateError
	var cut *cutError
	switch {
	case errors.As(err, &cut) && cut.wait == waitMessage && ctx.Err() == nil:
		return "", false
	case errors.Is(err, dedupe.ErrMisconfigured) || (pgerr.IsConfiguration(err) && !dedupe.IsRetryable(err)):
		return OutcomeMisconfigured, true
	case errors.As(err, &late) || ctx.Err() != nil || c.mw.unavailable(ctx, err):
		return OutcomeUnavailable, true
	}
	return "", false
}

// attempt runs one batch transaction (runBatch) bounded by
// BatchConfig.Timeout. An attempt cut while its handler ran the messages'
// own work returns the *cutError, to be split; any other attempt that fails
// once its deadline passed returns a *lateError, an outage: a call on a
// connection whose peer is gone, a lock held by a session that no longer
// answers, a session that could not be read.
func (c *BatchConsumer) attempt(ctx context.Context, items []item) ([]dedupe.BatchClaim, error) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	answers, err := c.runBatch(actx, items)
	return answers, c.judge(ctx, actx.Err(), err)
}

// judge returns the error of an attempt that ended with err, its own
// context ended with actxErr: a cut while the handler ran the messages'
// own work, or whose verdict is unknown while the database answers (as
// the per-message path counts it, so that it cannot hold the batch's
// partitions for ever), as is, to be split down to the message, which the
// per-message path counts; any other failure once the deadline passed, a
// *lateError.
func (c *BatchConsumer) judge(ctx context.Context, actxErr, err error) error {
	var cut *cutError
	if errors.As(err, &cut) && (cut.wait == waitMessage || (cut.wait == waitUnknown && !c.mw.unavailable(ctx, err))) {
		cut.wait = waitMessage
		return err
	}
	if err != nil && ctx.Err() == nil && errors.Is(actxErr, context.DeadlineExceeded) {
		err = &lateError{timeout: c.cfg.Timeout, err: err}
	}
	return err
}

// lateError is a batch attempt that failed after BatchConfig.Timeout.
type lateError struct {
	timeout time.Duration
	err     error
}

func (e *lateError) Error() string {
	return fmt.Sprintf("consumer: the batch attempt outlived BatchConfig.Timeout (%v): %v", e.timeout, e.err)
}

func (e *lateError) Unwrap() error { return e.err }

// runBatch runs one batch transaction on the store's DoBatch.
func (c *BatchConsumer) runBatch(ctx context.Context, items []item) (answers []dedupe.BatchClaim, err error) {
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		msgs[i] = it.msg
	}
	outputs := make([][]*message.Message, len(items))
	reqs := make([]dedupe.Request, len(items))
	for i, it := range items {
		reqs[i] = it.req
	}
	answers, err = c.store.DoBatch(ctx, reqs, func(ctx context.Context, tx pgx.Tx, fresh []int) ([][]byte, error) {
		if claims, ok := dedupe.BatchClaimsFromContext(ctx); ok {
			if held, ok := heldAt(claims, fresh); ok {
				return nil, held
			}
			if held, ok := c.foreignAt(reqs, claims); ok {
				return nil, held
			}
		}
		in := make([]*message.Message, len(fresh))
		for j, i := range fresh {
			in[j] = msgs[i]
		}
		watch := watchCut(ctx, c.mw.pool, tx.Conn())
		guard := txguard.Wrap(tx, "the batch handler")
		defer guard.End()
		outs, err := c.call(ctx, guard, in)
		if cut := cutBy(ctx, watch, err); cut != nil {
			return nil, cut
		}
		if broken := guard.Check(err); broken != nil {
			// The handler's fault, not a message's: every message of the
			// batch fails for good with it, once split down to one.
			return nil, dedupe.Permanent(fmt.Errorf("consumer: %w", broken))
		}
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
	if held, ok := c.foreignAt(reqs, answers); ok {
		// Only duplicates in the attempt that committed (fn judged the
		// claims of the attempts it ran in, but a retried attempt may find
		// as duplicates keys that were fresh before): nothing ran, nothing
		// was written.
		return nil, held
	}
	c.keep(items, answers, outputs)
	return answers, nil
}

// foreignAt returns the first duplicate whose key was applied from another
// topic (see Middleware.foreign): the batch is cut there, and the message
// takes the per-message path, which holds it with the error.
func (c *BatchConsumer) foreignAt(reqs []dedupe.Request, claims []dedupe.BatchClaim) (*heldError, bool) {
	for i := 0; i < len(claims) && i < len(reqs); i++ {
		if claims[i].Err != nil || claims[i].Decision != dedupe.DecisionDuplicate {
			continue
		}
		if err := c.mw.foreign(reqs[i], claims[i].Record); err != nil {
			return &heldError{index: i, err: err}, true
		}
	}
	return nil, false
}

// keep remembers the outputs of the messages that ran, for finish.
func (c *BatchConsumer) keep(items []item, answers []dedupe.BatchClaim, outputs [][]*message.Message) {
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
	// The handler sees copies whose Ack and Nack reach nothing: the batch
	// acks each message itself, after the commit (see handlerMessage).
	in := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		in[i] = handlerMessage(m, m.Context())
	}
	defer func() {
		for _, hm := range in {
			c.mw.noteAck(hm)
		}
	}()
	outs, err = c.handler(ctx, tx, in)
	if err == nil && len(outs) != 0 && len(outs) != len(msgs) {
		// A broken contract is no message's fault, and no split fixes it:
		// nothing is committed, and the messages come back until the
		// handler is fixed (logged at ERROR).
		err = fmt.Errorf("consumer: %w: the batch handler returned %d output slices for %d messages: "+
			"return nil or one slice per message, in the order of msgs; nothing is committed and the messages "+
			"are delivered again", dedupe.ErrMisconfigured, len(outs), len(msgs))
	}
	for i := 0; err == nil && i < len(outs); i++ {
		if key, kerr := c.mw.keyOf(msgs[i], c.cfg.Scope); kerr == nil {
			fillOutputIDs(key, msgs[i], outs[i])
		}
		// An output without a context of its own gets its command's (the
		// trace it belongs to, for Outputs that read it).
		for _, o := range outs[i] {
			if o != nil && o.Context() == context.Background() {
				o.SetContext(msgs[i].Context())
			}
		}
	}
	return outs, err
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

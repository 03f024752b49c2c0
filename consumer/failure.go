package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"
	"weak"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
)

// msgState is what the middleware remembers of a message that failed.
type msgState struct {
	failures  int // attempts that failed because of the message
	permanent int // permanent errors returned for it
	// last is the delivery that got the last permanent error, lastErr;
	// retried counts the times that delivery came back.
	last    weak.Pointer[message.Message]
	lastErr error
	retried int
}

// maxTracked bounds the failing messages remembered; each partition has
// few in flight, so this is only reached when partitions move away.
const maxTracked = 10000

// identity names a message for the failure counts: its key and where it
// came from, which its redeliveries share (a share group's copies too: their
// context carries their original's coordinates).
func identity(msg *message.Message, ev *Event) string {
	return fmt.Sprintf("%s/%s %s/%d/%d %s", ev.Scope, ev.Key, ev.Topic, ev.Partition, ev.Offset, msg.UUID)
}

// state returns the message's record, creating it; m.mu held.
func (m *Middleware) state(id string) *msgState {
	st := m.messages[id]
	if st == nil {
		if len(m.messages) >= maxTracked {
			for k := range m.messages { // forget one at random
				delete(m.messages, k)
				break
			}
		}
		st = &msgState{}
		m.messages[id] = st
	}
	return st
}

func (m *Middleware) forget(msg *message.Message, ev *Event) {
	m.mu.Lock()
	delete(m.messages, identity(msg, ev))
	m.mu.Unlock()
}

// permanent records a permanent error for the message. One that comes back
// after a permanent error was not dead-lettered: the PoisonQueue is missing,
// filters it out, or cannot publish (a dead-letter topic that does not
// exist). That is logged at ERROR with the fix; the message stays where it is.
func (m *Middleware) permanent(msg *message.Message, ev *Event, err error) error {
	m.mu.Lock()
	st := m.state(identity(msg, ev))
	st.permanent++
	n := st.permanent
	st.last, st.lastErr, st.retried = weak.Make(msg), err, 0
	m.mu.Unlock()
	if n > 1 {
		m.cfg.Logger.ErrorContext(msg.Context(), "consumer: a message with a permanent error came back: it was not dead-lettered; "+
			"check that the dead-letter topic exists and that middleware.PoisonQueueWithFilter(pub, topic, dedupe.IsPermanent) "+
			"is the outermost middleware", "key", ev.Key, "scope", ev.Scope, "topic", ev.Topic, "partition", ev.Partition,
			"offset", ev.Offset, "uuid", msg.UUID, "times", n, "err", err)
	}
	return err
}

// retriedPermanent answers a delivery that comes back to the middleware
// after a permanent error, the same *message.Message, so in process: a
// middleware.Retry without ShouldRetry retries every error. No retry can
// fix a permanent error, so it is returned again at once (neither the
// claim nor the handler run again), with the fix, for the PoisonQueue to
// dead-letter after the Retry gives up; the first time it is logged at
// ERROR with the fix. It returns nil for any other attempt.
func (m *Middleware) retriedPermanent(msg *message.Message, ev *Event) error {
	m.mu.Lock()
	st := m.messages[identity(msg, ev)]
	if st == nil || st.lastErr == nil || st.last.Value() != msg {
		m.mu.Unlock()
		return nil
	}
	st.retried++
	n, last := st.retried, st.lastErr
	m.mu.Unlock()
	if n == 1 {
		m.cfg.Logger.ErrorContext(msg.Context(), "consumer: a permanent error was retried in process: "+
			"the middleware.Retry has no ShouldRetry; set middleware.Retry{ShouldRetry: consumer.ShouldRetry} "+
			"(the message is dead-lettered once the Retry gives up)", "key", ev.Key, "scope", ev.Scope,
			"topic", ev.Topic, "partition", ev.Partition, "offset", ev.Offset, "uuid", msg.UUID, "err", last)
	}
	return fmt.Errorf("consumer: message %s was retried in process after a permanent error, which no retry can fix "+
		"(set middleware.Retry{ShouldRetry: consumer.ShouldRetry}): %w", msg.UUID, last)
}

// failed classifies a failed attempt. A configuration error and a failure
// of the infrastructure (the database or its connection) never count
// against the message; the handler's own failure does, while the database
// answers, and after Config.MaxAttempts of them the message is poison.
func (m *Middleware) failed(msg *message.Message, ev *Event, err error, ownErr bool) error {
	switch {
	case errors.Is(err, dedupe.ErrMisconfigured):
		return err
	case pgerr.IsConfiguration(err) && !dedupe.IsRetryable(err): // a store's retryable one: its tables changed under it
		return fmt.Errorf("consumer: %w: the handler's SQL names a table, column or schema that is not there "+
			"(run the service's migrations, or schema-qualify the name): %w", dedupe.ErrMisconfigured, err)
	case dedupe.IsPermanent(err):
		return m.permanent(msg, ev, err)
	case errors.Is(err, dedupe.ErrInFlight):
		return err
	}
	var cut *cutError
	switch {
	case errors.As(err, &cut) && cut.wait == waitDatabase:
		// Cut while waiting for the database: not the message's fault.
		ev.Outcome = OutcomeUnavailable
		return err
	case cut != nil && cut.wait == waitUnknown && m.unavailable(msg.Context(), err):
		// Not known, and the database does not answer now: not the
		// message's fault. While it answers, an unknown verdict counts
		// against the message, so that it cannot hold its partition for
		// ever.
		ev.Outcome = OutcomeUnavailable
		return err
	case cut != nil:
		// Cut while running its own work: counted, whatever the error
		// the cut left (a cancelled statement's, say).
	case !ownErr && errors.Is(msg.Context().Err(), context.DeadlineExceeded):
		// Cut outside the handler (the claim, the commit): not the
		// message's.
		ev.Outcome = OutcomeUnavailable
		return err
	case m.unavailable(msg.Context(), err):
		ev.Outcome = OutcomeUnavailable
		return err
	}
	if !ownErr || m.cfg.MaxAttempts < 0 {
		return err
	}
	m.mu.Lock()
	st := m.state(identity(msg, ev))
	st.failures++
	n := st.failures
	m.mu.Unlock()

	if n < m.cfg.MaxAttempts {
		return err
	}
	return m.permanent(msg, ev, fmt.Errorf("consumer: %w: %d attempts of %s failed while the database answered; the last: %w",
		dedupe.ErrPoisonMessage, n, identity(msg, ev), err))
}

// unavailable reports whether err is, or came with, a failure of the
// infrastructure: a transient database error, a lost connection, a shutdown
// (the message's context cancelled), an error the handler marked with
// dedupe.Retryable, or a database that does not answer a ping now.
func (m *Middleware) unavailable(ctx context.Context, err error) bool {
	if dedupe.IsRetryable(err) || pgerr.IsRetryable(err) || errors.Is(err, context.Canceled) {
		return true
	}
	if answered, serverFault := pgerr.Answered(err); answered {
		// The server answered: the database is there, unless its answer
		// says it failed (connection, resources, operator, system,
		// internal).
		return serverFault
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pingTimeout)
	defer cancel()
	return m.store.Ping(pctx) != nil
}

// pingTimeout bounds the ping that tells a failing message from a database
// that does not answer.
const pingTimeout = 2 * time.Second

// alone is the error of a batch handler run on one message (the
// per-message path) as that message's own: a MessageError for it (index 0,
// alone or joined) is its Err, whose text is the dead letter's reason,
// without "message 0 of the batch".
func alone(err error) error {
	if errs := messageErrors(err, 1); errs[0] != nil {
		return errs[0]
	}
	return err
}

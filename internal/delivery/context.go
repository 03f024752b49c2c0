package delivery

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// msgContext is the context of a message a partition delivers, made in
// one allocation (and one for its source), where context.WithCancel and a
// context.WithValue per value made five: the subscription's values (base,
// without its cancellation), the record as it arrived (Arrived, under
// arrivedKey[R]) and its Kafka coordinates (dedupe.SourceFromContext).
// end cancels it (context.Canceled) once its message is acked or nacked,
// or given up when the partition stops. Its Done channel (that of a
// context.WithCancel of base, inner) is made only when asked for, as
// deriving a context asks for it; contexts derived from it, straight or
// through values on top, register with inner, as context's own
// cancellable contexts do, with no goroutine each.
type msgContext[R any] struct {
	base context.Context
	rec  *R
	src  any // a dedupe.Source

	mu    sync.Mutex
	ended bool
	// inner, made with Done, is a context of context.WithCancel of base
	// that end cancels: Done is its, and Value answers the context
	// package's look-up of its cancellable parent with it, so that a
	// context derived through contexts of context.WithValue on top (as
	// Watermill's Router makes for each handler) registers with it,
	// cancelled by the time end returns with no goroutine each.
	inner  context.Context
	cancel context.CancelFunc
	afters []*afterFunc
}

// afterFunc is a function to run when a msgContext ends; started says it
// ran or was stopped.
type afterFunc struct {
	f       func()
	started bool
}

// newMsgContext returns the context of a delivery of rec, at src.
func newMsgContext[R any](base context.Context, rec *R, src dedupe.Source) *msgContext[R] {
	return &msgContext[R]{base: base, rec: rec, src: src}
}

// Deadline is base's: none.
func (c *msgContext[R]) Deadline() (time.Time, bool) { return c.base.Deadline() }

// Done is closed when the context ends.
func (c *msgContext[R]) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		c.inner, c.cancel = context.WithCancel(c.base)
		if c.ended {
			c.cancel()
		}
	}
	return c.inner.Done()
}

// Err is context.Canceled once the context ended, nil before.
func (c *msgContext[R]) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return context.Canceled
	}
	return nil
}

// Value returns the record as it arrived, the message's coordinates, or
// base's value for any other key.
func (c *msgContext[R]) Value(key any) any {
	switch key {
	case arrivedKey[R]{}:
		return c.rec
	case dedupe.SourceContextKey:
		return c.src
	}
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return c.base.Value(key)
}

// AfterFunc runs f once the context ends: in end, or in a goroutine of its
// own when the context has already ended (the context package calls it
// holding a lock f takes); stop keeps f from running, and says whether it
// did. The context package calls it for the contexts derived from c, f
// cancelling one, instead of starting a goroutine for each: they are
// cancelled by the time end returns, as the children of a context of
// context.WithCancel are by its cancel.
func (c *msgContext[R]) AfterFunc(f func()) (stop func() bool) {
	a := &afterFunc{f: f}
	c.mu.Lock()
	if c.ended {
		a.started = true
		c.mu.Unlock()
		go f()
	} else {
		c.afters = append(c.afters, a)
		c.mu.Unlock()
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a.started {
			return false
		}
		a.started = true
		for i, x := range c.afters {
			if x == a {
				c.afters = slices.Delete(c.afters, i, i+1)
				break
			}
		}
		return true
	}
}

// end cancels the context. Only its first call does anything.
func (c *msgContext[R]) end() {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	if c.cancel != nil {
		c.cancel()
	}
	var run []func()
	for _, a := range c.afters {
		if !a.started {
			a.started = true
			run = append(run, a.f)
		}
	}
	c.afters = nil
	c.mu.Unlock()
	for _, f := range run {
		f()
	}
}

// String names the context, as context's own do.
func (c *msgContext[R]) String() string { return "delivery.msgContext" }

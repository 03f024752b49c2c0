package delivery

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

type mwKey struct{}

// What a handler does with a delivered message's context holds before and
// after its end: a deadline child, a child without cancellation, Cause of
// it and of its children, values set on top by a middleware through
// message.SetContext, AfterFunc stopped after end.
func TestMsgContextAsAHandlerUsesIt(t *testing.T) {
	r := &rec{Offset: 9}
	src := dedupe.Source{Topic: "t", Partition: 1, Offset: 9}
	ctx := newMsgContext(context.WithoutCancel(context.WithValue(context.Background(), valueKey{}, "v")), r, src)
	msg := message.NewMessage("u", nil)
	msg.SetContext(ctx)
	// A middleware adds a value and a deadline on top.
	dl, cancelDL := context.WithDeadline(context.WithValue(msg.Context(), mwKey{}, "mw"), time.Now().Add(time.Hour))
	defer cancelDL()
	msg.SetContext(dl)
	if got := Arrived(msg, func(*rec) string { return "u" }); got != r {
		t.Fatalf("Arrived %v through a middleware's context, want %v", got, r)
	}
	if s, ok := dedupe.SourceFromContext(msg.Context()); !ok || s != src {
		t.Fatalf("source %+v %v through a middleware's context", s, ok)
	}
	if msg.Context().Value(mwKey{}) != "mw" || msg.Context().Value(valueKey{}) != "v" {
		t.Fatal("a value is lost")
	}
	detached := context.WithoutCancel(msg.Context())
	stop := context.AfterFunc(ctx, func() {})
	if context.Cause(ctx) != nil || context.Cause(dl) != nil {
		t.Fatalf("Cause %v / %v before end", context.Cause(ctx), context.Cause(dl))
	}
	ctx.end()
	if stop() {
		t.Fatal("an AfterFunc stopped after end says it stopped it")
	}
	for name, c := range map[string]context.Context{"message": ctx, "deadline child": dl} {
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), context.Canceled) || !isClosed(c.Done()) {
			t.Fatalf("%s: Err %v Cause %v after end, want context.Canceled, Done closed", name, c.Err(), context.Cause(c))
		}
	}
	if detached.Err() != nil || detached.Value(mwKey{}) != "mw" || detached.Done() != nil {
		t.Fatalf("WithoutCancel of it: Err %v after end", detached.Err())
	}
	late, cancelLate := context.WithTimeoutCause(ctx, time.Hour, errors.New("late"))
	defer cancelLate()
	if !errors.Is(context.Cause(late), context.Canceled) {
		t.Fatalf("a child made after end: Cause %v, want context.Canceled", context.Cause(late))
	}
}

// Done, Err, children and AfterFunc asked for from many goroutines while
// the context ends: every child ends up cancelled, every AfterFunc runs
// once, and the race detector finds nothing.
func TestMsgContextConcurrentEnd(t *testing.T) {
	for range 200 {
		ctx := newMsgContext(context.Background(), &rec{}, dedupe.Source{})
		const n = 8
		var wg sync.WaitGroup
		children := make(chan context.Context, 2*n)
		var ran sync.WaitGroup
		ran.Add(n)
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_ = ctx.Done()
				_ = ctx.Err()
				c, cancel := context.WithCancel(ctx)
				_ = cancel
				children <- c
				d, cancelD := context.WithTimeout(c, time.Hour)
				_ = cancelD
				children <- d
				var once sync.Once
				context.AfterFunc(ctx, func() { once.Do(ran.Done) })
			}()
		}
		close(start)
		ctx.end()
		wg.Wait()
		close(children)
		for c := range children {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("a child made while its message's context ended is not cancelled within 10s")
			}
			if !errors.Is(c.Err(), context.Canceled) {
				t.Fatalf("child Err %v", c.Err())
			}
		}
		done := make(chan struct{})
		go func() { ran.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("an AfterFunc did not run within 10s of end")
		}
	}
}

// A context derived from a delivered message's context through a value a
// middleware set on top (as Watermill's Router does for every handler) is
// cancelled by the time end returns, and costs no goroutine, as one derived
// straight from it is.
func TestMsgContextChildThroughAValue(t *testing.T) {
	ctx := newMsgContext(context.WithoutCancel(context.Background()), &rec{}, dedupe.Source{})
	wrapped := context.WithValue(ctx, mwKey{}, "router")
	before := runtime.NumGoroutine()
	const n = 100
	children := make([]context.Context, n)
	for i := range children {
		c, cancel := context.WithTimeout(wrapped, time.Hour)
		defer cancel()
		children[i] = c
	}
	if grown := runtime.NumGoroutine() - before; grown >= n/2 {
		t.Errorf("%d contexts derived through a value started %d goroutines", n, grown)
	}
	ctx.end()
	for i, c := range children {
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), context.Canceled) {
			t.Fatalf("child %d: Err %v Cause %v right after end, want context.Canceled", i, c.Err(), context.Cause(c))
		}
	}
}

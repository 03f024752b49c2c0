package delivery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/dedupe"
)

type valueKey struct{}

// A delivered message's context carries the subscription's values, the
// record as it arrived and its coordinates, and is cancelled at end, the
// contexts derived from it with it.
func TestMsgContext(t *testing.T) {
	sub, cancelSub := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "v"))
	r := &rec{Offset: 7}
	src := dedupe.Source{Topic: "t", Partition: 3, Offset: 7}
	ctx := newMsgContext(context.WithoutCancel(sub), r, src)
	cancelSub() // the subscription's cancellation does not reach it
	if got, ok := dedupe.SourceFromContext(ctx); !ok || got != src {
		t.Fatalf("source %+v %v, want %+v", got, ok, src)
	}
	if ctx.Value(valueKey{}) != "v" {
		t.Fatal("the subscription's value is not in the message's context")
	}
	msg := message.NewMessage("u1", nil)
	msg.SetContext(ctx)
	if Arrived(msg, func(*rec) string { return "u1" }) != r {
		t.Fatal("the record the message was made of is not found")
	}
	if ctx.Err() != nil {
		t.Fatalf("Err %v before end", ctx.Err())
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a deadline")
	}
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	timed, cancelTimed := context.WithTimeout(ctx, time.Hour)
	defer cancelTimed()
	_, cancelStopped := context.WithCancel(ctx)
	cancelStopped() // its registration with ctx is stopped
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	never := context.AfterFunc(ctx, func() { t.Error("a stopped AfterFunc ran") })
	if !never() {
		t.Fatal("stop before end did not stop")
	}

	ctx.end()
	ctx.end() // a second end does nothing
	if !errors.Is(ctx.Err(), context.Canceled) || !isClosed(ctx.Done()) {
		t.Fatalf("Err %v after end, want context.Canceled and Done closed", ctx.Err())
	}
	for name, c := range map[string]context.Context{"WithCancel": child, "WithTimeout": timed} {
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("derived (%s) Err %v right after end, want context.Canceled", name, c.Err())
		}
	}
	if !errors.Is(context.Cause(child), context.Canceled) {
		t.Fatalf("derived Cause %v, want context.Canceled", context.Cause(child))
	}
	late, cancelLate := context.WithCancel(ctx)
	defer cancelLate()
	if !errors.Is(late.Err(), context.Canceled) {
		t.Fatalf("a context derived after end: Err %v, want context.Canceled", late.Err())
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc did not run within 10s of end")
	}
	lateRan := make(chan struct{})
	context.AfterFunc(ctx, func() { close(lateRan) })
	select {
	case <-lateRan:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc after end did not run within 10s")
	}
}

// Done made after end is closed.
func TestMsgContextDoneAfterEnd(t *testing.T) {
	ctx := newMsgContext(context.Background(), &rec{}, dedupe.Source{})
	ctx.end()
	if !isClosed(ctx.Done()) {
		t.Fatal("Done asked for after end is open")
	}
}

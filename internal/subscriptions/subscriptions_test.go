package subscriptions

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Close cancels every running subscription, waits for it and closes its
// channel; a Start after Close runs nothing.
func TestCloseEndsSubscriptions(t *testing.T) {
	s := New()
	out := make(chan *message.Message)
	returned := make(chan struct{})
	if !s.Start(context.Background(), out, func(ctx context.Context) { <-ctx.Done(); close(returned) }) {
		t.Fatal("Start refused before Close")
	}
	s.Close()
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before the subscription did")
	}
	if _, open := <-out; open {
		t.Fatal("the channel is open after Close")
	}
	ran := false
	if s.Start(context.Background(), make(chan *message.Message), func(context.Context) { ran = true }) || ran {
		t.Fatal("Start ran after Close")
	}
	s.Close() // idempotent
}

// A subscription whose own context ends returns and closes its channel
// without Close.
func TestContextEndsOneSubscription(t *testing.T) {
	s := New()
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan *message.Message)
	s.Start(ctx, out, func(ctx context.Context) { <-ctx.Done() })
	cancel()
	select {
	case _, open := <-out:
		if open {
			t.Fatal("a message on the channel")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the channel is still open after its context ended")
	}
}

// Package subscriptions runs the subscriptions of a Watermill Subscriber
// (kafkapubsub's, kgopubsub's), each in a goroutine of its own, until the
// Subscriber closes.
package subscriptions

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Set is a Subscriber's subscriptions. Its zero value is not ready: use
// New.
type Set struct {
	closing chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	closed  bool
}

// New returns an empty Set.
func New() *Set { return &Set{closing: make(chan struct{})} }

// Start runs run in a goroutine of its own, with a context that ends with
// ctx or at Close, and closes out once run returns. After Close it runs
// nothing and returns false.
func (s *Set) Start(ctx context.Context, out chan *message.Message, run func(ctx context.Context)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	ctx, cancel := context.WithCancel(ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		run(ctx)
	}()
	return true
}

// Close ends every subscription and waits for their goroutines to return.
// It is idempotent.
func (s *Set) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.wg.Wait()
}

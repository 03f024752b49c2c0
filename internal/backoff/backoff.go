// Package backoff is the one exponential back-off of the module: a pause
// that doubles after each failed attempt, up to a cap.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/exactly-go/exactly/internal/clock"
)

// Backoff hands out the pauses between attempts: first, then twice the
// previous one up to max. The zero value pauses 0 every time.
// It is not safe for concurrent use.
type Backoff struct {
	first, next, max time.Duration
}

// New returns a Backoff whose first pause is first and whose later pauses
// double up to max.
func New(first, max time.Duration) *Backoff {
	return &Backoff{first: first, next: first, max: max}
}

// Next returns the next pause and doubles the one after it, up to the cap.
func (b *Backoff) Next() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

// Jittered returns Next spread uniformly over [d/2, 3d/2), so that workers
// that failed together do not retry together.
func (b *Backoff) Jittered() time.Duration {
	d := b.Next()
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d)
}

// Reset makes the next pause the first again, after a success.
func (b *Backoff) Reset() { b.next = b.first }

// Sleep waits for Next, or until ctx is done (then it returns ctx's error).
func (b *Backoff) Sleep(ctx context.Context) error { return clock.Sleep(ctx, b.Next()) }

// SleepJittered waits for Jittered, or until ctx is done.
func (b *Backoff) SleepJittered(ctx context.Context) error { return clock.Sleep(ctx, b.Jittered()) }

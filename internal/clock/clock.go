// Package clock holds the one pause that every retry loop here uses.
package clock

import (
	"context"
	"time"
)

// Sleep pauses for d, or until ctx is done (then it returns ctx.Err()).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

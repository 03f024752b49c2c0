package outbox

import (
	"context"
	"time"

	"github.com/exactly-go/exactly/internal/clock"
)

// listen turns notifications into wake-ups, reconnecting with back-off.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	channelPayload := r.cfg.Schema + "." + r.cfg.Table
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 10*time.Second) {
		conn, err := r.pool.Acquire(ctx)
		if err != nil {
			_ = clock.Sleep(ctx, backoff)
			continue
		}
		if _, err := conn.Exec(ctx, listenSQL); err != nil {
			conn.Release()
			_ = clock.Sleep(ctx, backoff)
			continue
		}
		// Listening: wake the relay so that it registers before it sleeps.
		r.listening.Store(true)
		select {
		case wake <- struct{}{}:
		default:
		}
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				r.listening.Store(false)
				break
			}
			backoff = 100 * time.Millisecond
			if n.Payload == channelPayload {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
		// The connection may be mid-wait: never hand it back to the pool.
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
	}
}

package outbox

import (
	"context"
	"time"

	"github.com/exactly-go/exactly/internal/backoff"
)

// listen turns notifications into wake-ups, reconnecting with back-off.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	channelPayload := r.cfg.Schema + "." + r.cfg.Table
	wait := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		conn, err := r.pool.Acquire(ctx)
		if err != nil {
			_ = wait.Sleep(ctx)
			continue
		}
		if _, err := conn.Exec(ctx, listenSQL); err != nil {
			conn.Release()
			_ = wait.Sleep(ctx)
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
			wait.Reset()
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

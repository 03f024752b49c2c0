package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/backoff"
)

// listen turns notifications into wake-ups, reconnecting with back-off.
// Taking the connection and LISTEN are bounded by StatementTimeout; the
// wait is not, but after StatementTimeout without a notification it pings
// the connection (bounded too), so that one whose peer is silently gone is
// replaced instead of waiting forever. A wait cut by its deadline leaves
// the connection as it was: a notification that arrives during the ping is
// kept for the next wait.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	channelPayload := r.cfg.Schema + "." + r.cfg.Table
	wait := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		actx, cancel := r.bounded(ctx)
		conn, err := r.pool.Acquire(actx)
		if err == nil {
			if _, err = conn.Exec(actx, listenSQL); err != nil {
				conn.Release()
			}
		}
		cancel()
		if err != nil {
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
			n, err := r.waitForNotification(ctx, conn)
			if err != nil {
				r.listening.Store(false)
				break
			}
			if n == nil {
				continue // quiet, and the connection answers
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
		cctx, cancel := r.bounded(context.WithoutCancel(ctx))
		_ = conn.Conn().Close(cctx)
		cancel()
		conn.Release()
	}
}

// waitForNotification waits up to StatementTimeout for a notification on
// conn. It returns nil and no error when none came and conn answers a ping.
func (r *Relay) waitForNotification(ctx context.Context, conn *pgxpool.Conn) (*pgconn.Notification, error) {
	wctx, cancel := r.bounded(ctx)
	n, err := conn.Conn().WaitForNotification(wctx)
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || conn.Conn().IsClosed() {
		return n, err
	}
	pctx, cancel := r.bounded(ctx)
	defer cancel()
	if err := conn.Conn().Ping(pctx); err != nil {
		return nil, err
	}
	return nil, nil
}

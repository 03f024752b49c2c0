package outbox

import (
	"context"
	"time"

	"github.com/exactly-go/exactly/internal/clock"
)

// waitGrace is how long a relay that just registered as a waiter gives
// producers that looked before it registered (and so did not notify) to
// finish committing, before it checks for their rows and sleeps.
const waitGrace = 10 * time.Millisecond

// hasWaiters reports whether the outbox has a waiters table (migration
// 00003). Without it the relay does not register, and producers notify as
// their trigger says; Run asks again before each sleep until it is there
// (a migration may add it while the relay runs).
func (r *Relay) hasWaiters(ctx context.Context) bool {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	var ok bool
	if err := r.pool.QueryRow(ctx, hasWaitersSQL, r.waiters).Scan(&ok); err != nil {
		return false
	}
	return ok
}

// register records that this relay is about to sleep, for a little more
// than PollInterval (a relay that dies stops counting after that), waits
// waitGrace, and reports whether it is registered. A stop (ctx ending)
// does not cut the statement short: cut, it may still commit on the server
// after Run's last unregister ran (and found nothing), and the
// registration would outlive the relay; only StatementTimeout bounds it.
func (r *Relay) register(ctx context.Context) bool {
	ttl := 2*r.cfg.PollInterval + 10*time.Second
	ectx, cancel := r.bounded(context.WithoutCancel(ctx))
	_, err := r.pool.Exec(ectx, r.q.register, r.id, float64(ttl.Microseconds()))
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox: relay could not register as a waiter; it will poll", "table", r.table, "err", err)
		}
		return false
	}
	_ = clock.Sleep(ctx, waitGrace)
	return true
}

func (r *Relay) unregister(ctx context.Context, registered bool) {
	if !registered {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(uctx, r.q.unregister, r.id); err != nil {
		// Producers go on notifying until the registration expires.
		r.cfg.Logger.Warn("outbox: relay could not unregister as a waiter", "table", r.table, "err", err)
	}
}

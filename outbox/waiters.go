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
// waitGrace, and reports whether it is registered.
//
// A registration must not outlive the relay, nor a relay that gave up on
// it: a statement the client cut short (a closed connection) may still
// commit on the server, after Run's last unregister found nothing. So a
// stop (ctx ending) does not cut the statement, only StatementTimeout
// does; and a statement cut by it is forgotten: once the server process
// that ran it has ended (nothing of it commits after that), the
// registration it may have made is deleted.
func (r *Relay) register(ctx context.Context) bool {
	ttl := 2*r.cfg.PollInterval + 10*time.Second
	actx, cancel := r.bounded(ctx)
	conn, err := r.pool.Acquire(actx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.Logger.Warn("outbox: relay could not register as a waiter; it will poll", "table", r.table, "err", err)
		}
		return false
	}
	ectx, cancel := r.bounded(context.WithoutCancel(ctx))
	_, err = conn.Exec(ectx, r.q.register, r.id, float64(ttl.Microseconds()))
	cancel()
	cut, pid := conn.Conn().PgConn().IsClosed(), conn.Conn().PgConn().PID()
	conn.Release()
	if err != nil {
		r.cfg.Logger.Warn("outbox: relay could not register as a waiter; it will poll", "table", r.table, "err", err)
		if cut {
			r.forget(ctx, pid)
		}
		return false
	}
	_ = clock.Sleep(ctx, waitGrace)
	return true
}

// forgetWait bounds how long a relay waits for the server process of a
// registration cut short to end (it neither publishes nor polls
// meanwhile); past it, a registration that commits later lasts until it
// expires (producers notify for nothing until then).
const forgetWait = 30 * time.Second

// forget deletes the registration that a statement cut short on the
// server process pid may have made, once that process has ended (or
// forgetWait passed).
func (r *Relay) forget(ctx context.Context, pid uint32) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetWait)
	defer cancel()
	for {
		var alive bool
		err := r.pool.QueryRow(fctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity
			WHERE pid = $1 AND pid <> pg_catalog.pg_backend_pid())`, int32(pid)).Scan(&alive)
		if err == nil && !alive || clock.Sleep(fctx, 20*time.Millisecond) != nil {
			break
		}
	}
	r.unregister(ctx, true)
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

package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// An attempt cut by its deadline (a middleware.Timeout, BatchConfig.Timeout)
// while its handler ran is judged by what the handler's session was doing
// just before the deadline (the last of the reads that run from shortly
// before it), read from pg_stat_activity on a connection of its own
// (outside the pool, so that no pool connection is held while another is
// waited for):
//
//   - waiting for the database — a lock another session holds, a read or a
//     write of the disk, a buffer, an internal lock, another backend or a
//     synchronous standby (wait_event_type Lock, LWLock, IO, BufferPin or
//     IPC): the infrastructure's fault, never counted against the message,
//     which is delivered again;
//   - anything else — the handler's own code between statements (the
//     session idle in its transaction), a statement computing, pg_sleep:
//     the message's, counted towards MaxAttempts like a handler's error.
//
// When the session could not be read (no deadline, a store without a pool,
// the read failed), the cut is taken as the infrastructure's.

// wait is what a cut attempt's session was doing before its deadline.
type wait int

const (
	waitUnknown  wait = iota // not read
	waitDatabase             // waiting for the database
	waitMessage              // running the message's work
)

// cutLead bounds how long before the deadline the session is first read;
// cutSample is how often it is read again until the deadline.
const (
	cutLead   = 200 * time.Millisecond
	cutSample = 10 * time.Millisecond
)

// cutWatch reads, from shortly before ctx's deadline until it, what the
// session of conn is doing, while the attempt still runs; the last read
// begun before the deadline is the answer (the first read, when none was).
// A handler that runs its own code and then waits for a lock held
// elsewhere until the deadline was cut waiting for the database.
type cutWatch struct {
	timer    *time.Timer
	deadline time.Time
	ended    chan struct{} // closed once the attempt ended (stop, result)
	done     chan struct{} // closed once got and what are set
	got      wait
	what     string
}

// watchCut starts watching the attempt on conn bounded by ctx; stop it
// with result. A nil pool or a ctx without deadline watches nothing.
func watchCut(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn) *cutWatch {
	dl, ok := ctx.Deadline()
	if !ok || pool == nil || conn == nil {
		return nil
	}
	left := time.Until(dl)
	lead := min(left/5, cutLead)
	pid := conn.PgConn().PID()
	w := &cutWatch{deadline: dl, ended: make(chan struct{}), done: make(chan struct{})}
	w.timer = time.AfterFunc(left-lead, func() {
		defer close(w.done)
		w.got, w.what = waitUnknown, ""
		w.watch(pool, pid)
	})
	return w
}

// watch reads the session pid's state until the deadline passes or the
// attempt ends, on a connection of its own.
func (w *cutWatch) watch(pool *pgxpool.Pool, pid uint32) {
	ctx, cancel := context.WithDeadline(context.Background(), w.deadline.Add(2*time.Second))
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for first := true; ; first = false {
		began := time.Now()
		got, what, err := readWait(ctx, conn, pid)
		if err != nil {
			return
		}
		if first || began.Before(w.deadline) {
			w.got, w.what = got, what
		}
		if !began.Before(w.deadline) {
			return
		}
		select {
		case <-w.ended:
			return
		case <-time.After(min(cutSample, time.Until(w.deadline)+time.Millisecond)):
		}
	}
}

// result stops the watch and returns what the session was doing, waiting
// for a read under way.
func (w *cutWatch) result() (wait, string) {
	if w == nil {
		return waitUnknown, ""
	}
	close(w.ended)
	if w.timer.Stop() {
		return waitUnknown, "" // the attempt ended before the deadline came near
	}
	<-w.done
	return w.got, w.what
}

// readWait reads the session pid's state and wait event on conn.
func readWait(ctx context.Context, conn *pgx.Conn, pid uint32) (wait, string, error) {
	var state, typ, event string
	if err := conn.QueryRow(ctx, `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
        FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&state, &typ, &event); err != nil {
		return waitUnknown, "", err
	}
	what := state
	if typ != "" {
		what = fmt.Sprintf("%s, waiting on %s %s", state, typ, event)
	}
	switch typ {
	case "Lock", "LWLock", "IO", "BufferPin", "IPC":
		// IPC: another backend's read of the same page (BufferIO, from
		// PostgreSQL 14 on), a synchronous standby, a checkpoint.
		return waitDatabase, what, nil
	}
	return waitMessage, what, nil
}

// cutError is an attempt cut by its deadline while its handler ran, with
// what its session was doing.
type cutError struct {
	wait wait
	what string
	err  error
}

func (e *cutError) Error() string {
	switch e.wait {
	case waitDatabase:
		return fmt.Sprintf("consumer: the attempt was cut by its deadline while waiting for the database (%s), "+
			"which is not the message's fault: %v", e.what, e.err)
	case waitMessage:
		return fmt.Sprintf("consumer: the attempt was cut by its deadline while running the message's work (%s): %v",
			e.what, e.err)
	}
	return fmt.Sprintf("consumer: the attempt was cut by its deadline: %v", e.err)
}

func (e *cutError) Unwrap() error { return e.err }

// cutBy returns err as a *cutError when the attempt bounded by ctx was cut
// by its deadline, with what the watch read; nil otherwise, at once: an
// attempt that was not cut never waits for a read under way (which ends
// and closes its connection on its own).
func cutBy(ctx context.Context, w *cutWatch, err error) *cutError {
	if err == nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		w.stop()
		return nil
	}
	got, what := w.result()
	return &cutError{wait: got, what: what, err: err}
}

// stop stops the watch without waiting for a read under way.
func (w *cutWatch) stop() {
	if w != nil {
		close(w.ended)
		w.timer.Stop()
	}
}

// storePool returns the pool of a store that has one (a *pgstore.Store).
func storePool(s Store) *pgxpool.Pool {
	if p, ok := s.(interface{ Pool() *pgxpool.Pool }); ok {
		return p.Pool()
	}
	return nil
}

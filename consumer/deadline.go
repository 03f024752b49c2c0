package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/clock"
)

// An attempt cut by its deadline (a middleware.Timeout, BatchConfig.Timeout)
// while its handler ran is judged by what the handler's session was doing
// just before the deadline (the last of the reads that run from shortly
// before it and were done by it), read from pg_stat_activity on another
// connection: one of the pool's when one is free at once, else one opened
// through the pool's own connect path (its BeforeConnect: IAM tokens,
// rotated passwords), so that no pool connection is waited for while the
// attempt holds one. The session is named by the server process ID read
// inside the attempt's own transaction (behind a pooler, the ID the
// connection was given at start-up is the pooler's, and a transaction
// pooler gives each transaction a server session of its own); on a
// connection where the two agree, the start-up one is used from then on.
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
// the read failed, no read done by the deadline), the verdict is unknown:
// the cut is the infrastructure's only while the database does not answer
// (failed), so that an unknown verdict cannot hold a partition for ever.

// wait is what a cut attempt's session was doing before its deadline.
type wait int

const (
	waitUnknown  wait = iota // not read
	waitDatabase             // waiting for the database
	waitMessage              // running the message's work
)

// cutLead bounds how long before the deadline the session is first read;
// cutSample is how often it is read again until the deadline; cutConnect
// bounds how long before the first read the connection that reads it is
// opened (a remote server, TLS, a loaded one: the opening must not eat the
// reads' time).
const (
	cutLead    = 200 * time.Millisecond
	cutSample  = 10 * time.Millisecond
	cutConnect = time.Second
)

// cutWatch reads, from shortly before ctx's deadline until it (on a
// connection opened a little earlier), what the session of conn is doing,
// while the attempt still runs; the last read that finished before the
// deadline is the answer (none: unknown). A read
// that ends after the deadline does not count, whenever it began: from the
// deadline on, the attempt's statement is being cancelled, and its session
// shows that. A handler that runs its own code and then waits for a lock
// held elsewhere until the deadline was cut waiting for the database.
type cutWatch struct {
	timer *time.Timer
	// ctx ends at the deadline, or once the attempt ended (stop, result).
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed once got and what are set
	got    wait
	what   string
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
	connect := min(left/5, cutConnect)
	pid, ok := sessionPID(ctx, conn)
	if !ok {
		return nil
	}
	w := &cutWatch{done: make(chan struct{})}
	w.ctx, w.cancel = context.WithDeadline(context.Background(), dl)
	w.timer = time.AfterFunc(left-lead-connect, func() {
		defer close(w.done)
		w.watch(pool, pid, dl.Add(-lead))
	})
	return w
}

// directKey marks, in a connection's CustomData, one whose start-up
// process ID is its server session's (no pooler in between).
const directKey = "exactly/consumer: direct"

// sessionPID returns the server process ID of the session that runs the
// transaction open on conn, read in it unless conn is known to reach the
// server directly; false when it could not be read.
func sessionPID(ctx context.Context, conn *pgx.Conn) (uint32, bool) {
	data := conn.PgConn().CustomData()
	if data[directKey] == true {
		return conn.PgConn().PID(), true
	}
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return 0, false
	}
	if pid == conn.PgConn().PID() {
		data[directKey] = true
	}
	return pid, true
}

// watchConn is the connection the watch reads on.
type watchConn interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// openWatch returns a connection to read on and its release: one of the
// pool's when one can be had within a millisecond, else one opened
// through the pool's connect path (BeforeConnect, then AfterConnect).
func openWatch(ctx context.Context, pool *pgxpool.Pool) (watchConn, func(), error) {
	actx, cancel := context.WithTimeout(ctx, time.Millisecond)
	pc, err := pool.Acquire(actx)
	cancel()
	if err == nil {
		return pc, pc.Release, nil
	}
	cfg := pool.Config()
	cc := cfg.ConnConfig.Copy()
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cc); err != nil {
			return nil, nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, nil, err
	}
	closeConn := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			closeConn()
			return nil, nil, err
		}
	}
	return conn, closeConn, nil
}

// watch opens a connection (openWatch) and, from readFrom, reads the
// session pid's state on it every cutSample until w.ctx ends, keeping the
// last read that finished before the deadline.
func (w *cutWatch) watch(pool *pgxpool.Pool, pid uint32, readFrom time.Time) {
	dl, _ := w.ctx.Deadline()
	conn, release, err := openWatch(w.ctx, pool)
	if err != nil {
		return
	}
	defer release()
	for wait := time.Until(readFrom); clock.Sleep(w.ctx, wait) == nil; wait = cutSample {
		got, what, err := readWait(w.ctx, conn, pid)
		if err != nil || !time.Now().Before(dl) {
			return
		}
		w.got, w.what = got, what
	}
}

// result stops the watch and returns what the session was doing, once a
// read under way has been cut short.
func (w *cutWatch) result() (wait, string) {
	if w == nil {
		return waitUnknown, ""
	}
	w.cancel()
	if w.timer.Stop() {
		return waitUnknown, "" // the attempt ended before the deadline came near
	}
	<-w.done
	return w.got, w.what
}

// readWaitSQL reads a session's state and wait event (a read is one round
// trip in every exec mode but describe_exec: the watch reads with the
// simple protocol).
const readWaitSQL = `SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_catalog.pg_stat_activity WHERE pid = $1`

// readWait reads the session pid's state and wait event on conn.
func readWait(ctx context.Context, conn watchConn, pid uint32) (wait, string, error) {
	var state, typ, event string
	if err := conn.QueryRow(ctx, readWaitSQL, pgx.QueryExecModeSimpleProtocol, int32(pid)).Scan(&state, &typ, &event); err != nil {
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
		w.timer.Stop()
		w.cancel()
	}
}

// storePool returns the pool of a store that has one (a *pgstore.Store).
func storePool(s Store) *pgxpool.Pool {
	if p, ok := s.(interface{ Pool() *pgxpool.Pool }); ok {
		return p.Pool()
	}
	return nil
}

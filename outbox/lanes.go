package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lanes is the number of lanes partition keys are spread over; at most this
// many relays work at once.
const Lanes = 16

// lockLanes takes, with one statement, every lane of want (nil: all)
// that no other relay holds, trying them in a random order. (A session
// may take an advisory lock twice: never ask for a lane it holds.)
func (r *Relay) lockLanes(ctx context.Context, conn *pgxpool.Conn, want []int) ([]int, error) {
	try := slices.Clone(want)
	if want == nil {
		try = rand.Perm(Lanes)
	}
	rand.Shuffle(len(try), func(i, j int) { try[i], try[j] = try[j], try[i] })
	var lanes []int16
	qctx, cancel := r.bounded(ctx)
	err := conn.QueryRow(qctx, lockLanesSQL, r.lockID, laneOrder(try)).Scan(&lanes)
	cancel()
	if err != nil {
		// The statement may have taken lanes before it failed: a
		// connection that cannot tell what it holds is closed, never
		// handed back to the pool holding them.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = conn.Conn().Close(cctx)
		cancel()
		return nil, fmt.Errorf("outbox: relay: lane lock: %w", err)
	}
	out := make([]int, len(lanes))
	for i, l := range lanes {
		out[i] = int(l)
	}
	return out, nil
}

// waitLane waits, at most PollInterval, for one lane that another relay
// holds (Postgres hands it over when that relay lets go between batches),
// then takes every other free lane too.
func (r *Relay) waitLane(ctx context.Context, conn *pgxpool.Conn) ([]int, error) {
	lane := rand.IntN(Lanes)
	// The wait itself takes up to PollInterval (lock_timeout) on the server.
	wctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout+r.cfg.PollInterval)
	defer cancel()
	tx, err := conn.Begin(wctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: lane wait: %w", err)
	}
	defer pgtx.Rollback(ctx, tx)
	timeout := strconv.FormatInt(max(r.cfg.PollInterval.Milliseconds(), 1), 10)
	if _, err := tx.Exec(wctx, lockTimeoutSQL, timeout); err != nil {
		return nil, fmt.Errorf("outbox: relay: lane wait: %w", err)
	}
	if _, err := tx.Exec(wctx, waitLaneSQL, r.lockID, lane); err != nil {
		// Postgres may grant the lock just as lock_timeout fires (or a
		// cancel arrives) and still fail the statement; a session lock
		// outlives the aborted transaction. Look before the connection goes
		// back to the pool: holding the lane there, it would keep every
		// relay away from it for as long as the connection lives.
		pgtx.Rollback(ctx, tx)
		held, herr := r.holdsLane(ctx, conn, lane)
		if herr != nil {
			return nil, herr
		}
		if !held {
			return nil, nil // still taken: the relay that holds it publishes
		}
	} else if err := tx.Commit(wctx); err != nil {
		// A session lock outlives the transaction.
		return nil, r.releaseAfter(ctx, conn, []int{lane}, fmt.Errorf("outbox: relay: lane wait: %w", err))
	}
	others := slices.DeleteFunc(rand.Perm(Lanes), func(l int) bool { return l == lane })
	more, err := r.lockLanes(ctx, conn, others)
	if err != nil {
		return nil, r.releaseAfter(ctx, conn, []int{lane}, err)
	}
	return append([]int{lane}, more...), nil
}

// holdsLane reports whether conn's session holds lane, even when ctx is
// done. A connection that cannot tell is closed, never handed back to the
// pool.
func (r *Relay) holdsLane(ctx context.Context, conn *pgxpool.Conn, lane int) (bool, error) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var held bool
	if err := conn.QueryRow(hctx, holdsLaneSQL, r.lockID, lane).Scan(&held); err != nil {
		_ = conn.Conn().Close(hctx)
		return false, fmt.Errorf("outbox: relay: lane wait: %w", err)
	}
	return held, nil
}

func (r *Relay) releaseAfter(ctx context.Context, conn *pgxpool.Conn, lanes []int, err error) error {
	if uerr := r.unlockLanes(ctx, conn, lanes); uerr != nil {
		return fmt.Errorf("%w; %w", err, uerr)
	}
	return err
}

// unlockLanes lets go of lanes, even when ctx is done. A connection that
// cannot tell whether it still holds a lane is closed, never handed back to
// the pool.
func (r *Relay) unlockLanes(ctx context.Context, conn *pgxpool.Conn, lanes []int) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var ok bool
	err := conn.QueryRow(uctx, unlockLanesSQL, r.lockID, laneOrder(lanes)).Scan(&ok)
	if err == nil && !ok {
		err = fmt.Errorf("lane(s) %v were not held", lanes)
	}
	if err != nil {
		_ = conn.Conn().Close(uctx)
		return fmt.Errorf("outbox: relay: lane unlock: %w", err)
	}
	return nil
}

func laneOrder(lanes []int) []int16 {
	out := make([]int16, len(lanes))
	for i, l := range lanes {
		out[i] = int16(l)
	}
	return out
}

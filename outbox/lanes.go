package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/pgtx"
)

// Lanes is the number of lanes partition keys are spread over; at most this
// many relays work at once.
const Lanes = 16

// A relay holds its lanes under transaction-scoped advisory locks, in a
// transaction of its own (READ COMMITTED, whatever the role's default, so
// that each statement sees the marks committed beside it): they end with
// it, on COMMIT, ROLLBACK or a lost connection, and no connection goes back
// to the pool holding a lane. Behind a transaction pooler (PgBouncer in
// transaction mode) the transaction keeps every statement on one server
// connection.

// beginLanes opens the transaction that holds lanes.
func (r *Relay) beginLanes(ctx context.Context, conn *pgxpool.Conn) (pgx.Tx, error) {
	bctx, cancel := r.bounded(ctx)
	defer cancel()
	tx, err := conn.BeginTx(bctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: lane lock: %w", err)
	}
	return tx, nil
}

// lockLanes takes, in tx and with one statement, every lane of want (nil:
// all) that no other relay holds, trying them in a random order. (A
// transaction may take an advisory lock twice: never ask for a lane it
// holds.) On an error tx is rolled back.
func (r *Relay) lockLanes(ctx context.Context, tx pgx.Tx, want []int) ([]int, error) {
	try := slices.Clone(want)
	if want == nil {
		try = rand.Perm(Lanes)
	}
	rand.Shuffle(len(try), func(i, j int) { try[i], try[j] = try[j], try[i] })
	var lanes []int16
	qctx, cancel := r.bounded(ctx)
	err := tx.QueryRow(qctx, lockLanesSQL, r.lockID, laneOrder(try)).Scan(&lanes)
	cancel()
	if err != nil {
		pgtx.Rollback(ctx, tx) // lets go of whatever the statement took
		return nil, fmt.Errorf("outbox: relay: lane lock: %w", err)
	}
	out := make([]int, len(lanes))
	for i, l := range lanes {
		out[i] = int(l)
	}
	return out, nil
}

// takeLanes begins a transaction on conn and takes in it every lane of
// want (nil: all) that no other relay holds. With none taken it returns
// no transaction.
func (r *Relay) takeLanes(ctx context.Context, conn *pgxpool.Conn, want []int) (pgx.Tx, []int, error) {
	tx, err := r.beginLanes(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	held, err := r.lockLanes(ctx, tx, want)
	if err != nil {
		return nil, nil, err
	}
	if len(held) == 0 {
		pgtx.Rollback(ctx, tx)
		return nil, nil, nil
	}
	return tx, held, nil
}

// waitLane waits, at most PollInterval, for one lane that another relay
// holds (Postgres hands it over when that relay lets go between batches),
// then takes every other free lane too, all in one transaction that it
// returns (none when the wait timed out).
func (r *Relay) waitLane(ctx context.Context, conn *pgxpool.Conn) (pgx.Tx, []int, error) {
	lane := rand.IntN(Lanes)
	tx, err := r.beginLanes(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	// The wait itself takes up to PollInterval (lock_timeout) on the server.
	wctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout+r.cfg.PollInterval)
	defer cancel()
	timeout := strconv.FormatInt(max(r.cfg.PollInterval.Milliseconds(), 1), 10)
	if _, err := tx.Exec(wctx, lockTimeoutSQL, timeout); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, nil, fmt.Errorf("outbox: relay: lane wait: %w", err)
	}
	if _, err := tx.Exec(wctx, waitLaneSQL, r.lockID, lane); err != nil {
		// Timed out (or cancelled): the rollback lets go of the lock even
		// when Postgres granted it just as the statement failed.
		pgtx.Rollback(ctx, tx)
		return nil, nil, nil // still taken: the relay that holds it publishes
	}
	if _, err := tx.Exec(wctx, resetLockTimeoutSQL); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, nil, fmt.Errorf("outbox: relay: lane wait: %w", err)
	}
	others := slices.DeleteFunc(rand.Perm(Lanes), func(l int) bool { return l == lane })
	more, err := r.lockLanes(ctx, tx, others)
	if err != nil {
		return nil, nil, err
	}
	return tx, append([]int{lane}, more...), nil
}

// unlockLanes lets go of the lanes tx holds, even when ctx is done, by
// committing it (it holds the failures recorded under the lanes). When the
// commit fails the transaction is over all the same: no lane stays held.
func (r *Relay) unlockLanes(ctx context.Context, tx pgx.Tx) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := tx.Commit(uctx); err != nil {
		pgtx.Rollback(ctx, tx)
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

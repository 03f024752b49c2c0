package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/exactly-go/exactly/internal/advisory"
	"github.com/exactly-go/exactly/internal/pooler"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Relay publishes committed outbox rows through any Watermill publisher,
// at least once and in order per partition key (see the package doc for
// which order). Several relays may run at once: a lane (a sixteenth of the
// keys) is worked by one relay at a time, under a transaction-scoped advisory
// lock (it holds no session state: it runs behind a transaction pooler). A
// relay that dies mid-batch leaves its rows pending; they are published
// again with their original UUIDs, which consumers deduplicate.
type Relay struct {
	pool   *pgxpool.Pool
	pub    message.Publisher
	cfg    RelayConfig
	table  string
	q      queries
	lockID int64

	// id names this relay in the waiters table; listening is true while
	// its LISTEN connection is up.
	id        string
	waiters   string
	listening atomic.Bool
}

// NewRelay returns a Relay that reads the outbox on pool and publishes with pub.
func NewRelay(pool *pgxpool.Pool, pub message.Publisher, cfg *RelayConfig) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a publisher")
	}
	c, table, err := cfg.withDefaults(sqlident.DefaultSchema(pool.Config().ConnConfig))
	if err != nil {
		return nil, err
	}
	waiters := pgx.Identifier{c.Schema, c.Table + "_waiters"}.Sanitize()
	return &Relay{pool: pool, pub: pub, cfg: c, table: table, q: newQueries(table, waiters),
		lockID: advisory.LockID("outbox/"+c.Schema+"."+c.Table) &^ 0xff, id: strconv.FormatUint(rand.Uint64(), 36), waiters: waiters}, nil
}

// Run relays until ctx is done: it wakes on LISTEN/NOTIFY when rows are
// written and polls every PollInterval as a floor (only polls with
// RelayConfig.PollOnly, or behind a connection pooler). Before it sleeps it
// registers in the waiters table (migration 00003), so that producers
// notify only while some relay sleeps; a relay with work in hand is not
// registered and producers commit without the NOTIFY's lock. A relay whose
// only pending rows wait for a retry sleeps until the first is due. It
// returns nil when ctx is cancelled, after finishing the batch in hand, or
// the registration under way, which it then removes, so that no
// registration outlives the relay: that takes up to StatementTimeout, and
// up to 30s more (then 5s for the delete) when the server went on with a
// registration the timeout cut. It holds none of the pool's connections
// once it returns.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	lctx, stopListening := context.WithCancel(ctx)
	listened := make(chan struct{})
	if r.pollOnly(ctx) {
		close(listened)
	} else {
		go func() {
			defer close(listened)
			r.listen(lctx, wake)
		}()
	}
	waiters := false // the table has a waiters table; asked until it answers yes
	defer func() {
		r.unregister(ctx, waiters)
		stopListening()
		<-listened // its connection closed
	}()
	lastCleanup := time.Time{}
	for {
		n, err := r.RunOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.cfg.Logger.Warn("outbox: relay pass failed", "table", r.table, "err", err)
		}
		if time.Since(lastCleanup) > time.Minute && !r.cfg.DeletePublished {
			if _, err := r.Cleanup(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("outbox: cleanup failed", "table", r.table, "err", err)
			}
			lastCleanup = time.Now()
		}
		if n > 0 && err == nil {
			continue // there may be more
		}
		if !waiters {
			waiters = r.hasWaiters(ctx)
		}
		registered := waiters && r.listening.Load() && r.register(ctx)
		if registered {
			// Rows of producers that looked before we registered: they
			// did not notify. One more pass, then sleep in any case (rows
			// in lanes that other relays hold are theirs to publish).
			if n, err := r.RunOnce(ctx); n > 0 && err == nil {
				r.unregister(ctx, true)
				continue
			}
		}
		t := time.NewTimer(r.nextWake(ctx))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-wake:
		case <-t.C:
		}
		t.Stop()
		if registered {
			r.unregister(ctx, true) // awake: producers need not notify
		}
	}
}

// pollOnly reports whether Run polls only: RelayConfig.PollOnly, or a
// pool whose connections go through a connection pooler.
func (r *Relay) pollOnly(ctx context.Context) bool {
	if r.cfg.PollOnly {
		return true
	}
	dctx, cancel := r.bounded(ctx)
	defer cancel()
	info, err := pooler.Detect(dctx, r.pool)
	if err != nil || !info.Transaction {
		return false // LISTEN, as ever; a pooler missed here still leaves the poll
	}
	r.cfg.Logger.Info("outbox: relay polls only: its pool goes through a connection pooler, which may run in transaction mode, where LISTEN does not work "+
		"(set RelayConfig.PollOnly to say so, and PollInterval for the latency)", "table", r.table, "poll_interval", r.cfg.PollInterval)
	return true
}

// RunOnce publishes what is due in the lanes that no other relay holds,
// batch after batch, and returns how many messages it published. With
// nothing due it costs one statement. It lets go of its lanes at least
// every PollInterval, so that other relays take their share; a relay that
// finds every lane taken waits (at most PollInterval) for one.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	if !r.due(ctx) {
		return 0, nil
	}
	actx, cancel := r.bounded(ctx)
	conn, err := r.pool.Acquire(actx)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("outbox: relay: %w", err)
	}
	defer conn.Release()
	tx, held, err := r.takeLanes(ctx, conn, nil)
	if err == nil && tx == nil {
		tx, held, err = r.waitLane(ctx, conn)
	}
	if err != nil || tx == nil {
		return 0, err
	}
	m := r.newMarker()
	total, since, lanes := 0, time.Now(), held
	var pf *prefetch
	for ctx.Err() == nil {
		n, more, next, err := r.batch(ctx, conn, lanes, m, pf)
		pf = next
		total += n
		if err != nil {
			return total, r.release(ctx, conn, tx, m, err)
		}
		if len(more) == 0 {
			break
		}
		lanes = more // lanes that ran dry wait for the next pass
		if time.Since(since) < r.cfg.PollInterval {
			continue
		}
		// Time to share: let go, and take again those still free.
		pf = nil // read under locks let go
		if err := r.release(ctx, conn, tx, m, nil); err != nil {
			return total, err
		}
		if tx, held, err = r.takeLanes(ctx, conn, lanes); err != nil || tx == nil {
			return total, err
		}
		since, lanes = time.Now(), held
	}
	return total, r.release(ctx, conn, tx, m, nil)
}

// release waits for the marks in flight, then lets go of the lanes that tx
// holds. It returns every error: the batch's own (berr), the mark's, the
// unlock's.
func (r *Relay) release(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, m *marker, berr error) error {
	merr := m.close(ctx, conn)
	uerr := r.unlockLanes(ctx, tx)
	return errors.Join(berr, merr, uerr)
}

// due reports whether some message could be published now (true when it
// cannot tell).
func (r *Relay) due(ctx context.Context) bool {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	var due bool
	if err := r.pool.QueryRow(ctx, r.q.due).Scan(&due); err != nil {
		return true // cannot tell: look
	}
	return due
}

// nextWake is how long an idle relay sleeps: PollInterval, or less when a
// failed message is due for its retry sooner.
func (r *Relay) nextWake(ctx context.Context) time.Duration {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	var us *float64
	if err := r.pool.QueryRow(ctx, r.q.nextRetry).Scan(&us); err != nil || us == nil {
		return r.cfg.PollInterval
	}
	return min(max(time.Duration(*us)*time.Microsecond, time.Millisecond), r.cfg.PollInterval)
}

// bounded bounds ctx by StatementTimeout, for one database call.
func (r *Relay) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.StatementTimeout)
}

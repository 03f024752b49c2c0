package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/clock"
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	Config
	// BatchSize is how many rows one transaction publishes. Defaults to 100.
	BatchSize int
	// PollInterval is the polling floor when no notification arrives.
	// Defaults to 1s. It bounds the wait of a message whose producer did
	// not notify (see the package doc), and is the publishing latency when
	// the NOTIFY trigger is disabled.
	PollInterval time.Duration
	// RetryBackoff is the first pause before a failed message is tried
	// again; it doubles per attempt up to MaxRetryBackoff. Defaults to
	// 100ms and 1m.
	RetryBackoff, MaxRetryBackoff time.Duration
	// MaxAttempts moves a message that failed this many times to the DEAD
	// status, where operators see it (Stats, the table) and where it no
	// longer holds up the messages after it. Defaults to 10.
	MaxAttempts int
	// DeletePublished deletes rows once published instead of marking them
	// PUBLISHED (and deleting them after PublishedRetention). Defaults to false.
	DeletePublished bool
	// PublishedRetention is how long PUBLISHED rows are kept, for audits.
	// Defaults to 24h.
	PublishedRetention time.Duration
	// Hooks receives an event per batch. Defaults to none.
	Hooks Hooks
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// BatchEvent describes one published batch.
type BatchEvent struct {
	Lane      int
	Published int
	// Failed counts publish failures in the batch (to be retried).
	Failed int
	// Dead counts messages moved to DEAD in the batch.
	Dead int
	// Lag is the age of the oldest message published in the batch.
	Lag time.Duration
}

// Hooks receives relay events, for metrics.
type Hooks interface {
	OnBatch(ctx context.Context, ev BatchEvent)
}

// HooksFunc adapts a function to Hooks.
type HooksFunc func(ctx context.Context, ev BatchEvent)

// OnBatch calls f.
func (f HooksFunc) OnBatch(ctx context.Context, ev BatchEvent) { f(ctx, ev) }

// Relay publishes committed outbox rows through any Watermill publisher,
// at least once and in id order per partition key. Several relays may run
// at once: a lane (a sixteenth of the keys) is worked by one relay at a
// time, under a session advisory lock. A relay that dies mid-batch leaves
// its rows pending; they are published again with their original UUIDs,
// which consumers deduplicate.
type Relay struct {
	pool   *pgxpool.Pool
	pub    message.Publisher
	cfg    RelayConfig
	table  string
	q      relayQueries
	lockID int64

	// id names this relay in the waiters table; listening is true while
	// its LISTEN connection is up.
	id        string
	waiters   string
	listening atomic.Bool
}

type relayQueries struct {
	fetch, published, deleted, failed, cleanup, stats string
	register, unregister, pendingDue                  string
}

// waitGrace is how long a relay that just registered as a waiter gives
// producers that looked before it registered (and so did not notify) to
// finish committing, before it checks for their rows and sleeps.
const waitGrace = 10 * time.Millisecond

// NewRelay returns a Relay that reads the outbox on pool and publishes with pub.
func NewRelay(pool *pgxpool.Pool, pub message.Publisher, cfg *RelayConfig) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("outbox: NewRelay needs a pool and a publisher")
	}
	var c RelayConfig
	if cfg != nil {
		c = *cfg
	}
	base, table, err := c.Config.withDefaults()
	if err != nil {
		return nil, err
	}
	c.Config = base
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.PollInterval, time.Second)
	def(&c.RetryBackoff, 100*time.Millisecond)
	def(&c.MaxRetryBackoff, time.Minute)
	def(&c.PublishedRetention, 24*time.Hour)
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.BatchSize < 0 || c.MaxAttempts < 0 || c.PollInterval < 0 || c.RetryBackoff < 0 || c.MaxRetryBackoff < 0 || c.PublishedRetention < 0 {
		return nil, errors.New("outbox: RelayConfig sizes and durations must not be negative")
	}
	h := fnv.New64a()
	h.Write([]byte("exactly/outbox/" + c.Schema + "." + c.Table))
	waiters := pgx.Identifier{c.Schema, c.Table + "_waiters"}.Sanitize()
	return &Relay{pool: pool, pub: pub, cfg: c, table: table, lockID: int64(h.Sum64() &^ 0xff),
		id: strconv.FormatUint(rand.Uint64(), 36), waiters: waiters, q: relayQueries{
			register: `WITH expired AS (DELETE FROM ` + waiters + ` WHERE expires_at < clock_timestamp() AND relay <> $1)
INSERT INTO ` + waiters + ` (relay, expires_at) VALUES ($1, clock_timestamp() + $2::float8 * interval '1 microsecond')
ON CONFLICT (relay) DO UPDATE SET expires_at = EXCLUDED.expires_at`,
			unregister: `DELETE FROM ` + waiters + ` WHERE relay = $1`,
			pendingDue: `SELECT EXISTS (SELECT FROM ` + table + ` WHERE status = 'PENDING' AND next_attempt_at <= now())`,
			fetch: `SELECT id, topic, coalesce(partition_key, ''), uuid, metadata, payload, attempts, next_attempt_at <= now(), created_at
FROM ` + table + ` WHERE lane = $1 AND status = 'PENDING' ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`,
			published: `UPDATE ` + table + ` SET status = 'PUBLISHED', published_at = now(), attempts = attempts + 1, last_error = NULL WHERE id = ANY($1)`,
			deleted:   `DELETE FROM ` + table + ` WHERE id = ANY($1)`,
			failed: `UPDATE ` + table + ` SET attempts = attempts + 1, last_error = $2,
    next_attempt_at = now() + $3::float8 * interval '1 microsecond',
    status = CASE WHEN attempts + 1 >= $4 THEN 'DEAD' ELSE status END
WHERE id = $1 RETURNING status`,
			cleanup: `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + table + `
    WHERE status = 'PUBLISHED' AND published_at < now() - $1::float8 * interval '1 microsecond' LIMIT 1000))`,
			stats: `SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'DEAD'),
    min(created_at) FILTER (WHERE status = 'PENDING') FROM ` + table,
		}}, nil
}

// Run relays until ctx is done: it wakes on LISTEN/NOTIFY when rows are
// written and polls every PollInterval as a floor. Before it sleeps it
// registers in the waiters table (migration 00003), so that producers
// notify only while some relay sleeps; a relay with work in hand is not
// registered and producers commit without the NOTIFY's lock. It returns nil
// when ctx is cancelled (after finishing the batch in hand).
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	go r.listen(ctx, wake)
	waiters := false // the table has a waiters table; asked until it answers yes
	defer func() { r.unregister(ctx, waiters) }()
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
		t := time.NewTimer(r.cfg.PollInterval)
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

// hasWaiters reports whether the outbox has a waiters table (migration
// 00003). Without it the relay does not register, and producers notify as
// their trigger says; Run asks again before each sleep until it is there
// (a migration may add it while the relay runs).
func (r *Relay) hasWaiters(ctx context.Context) bool {
	var ok bool
	if err := r.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", r.waiters).Scan(&ok); err != nil {
		return false
	}
	return ok
}

// register records that this relay is about to sleep, for a little more
// than PollInterval (a relay that dies stops counting after that), waits
// waitGrace, and reports whether it is registered.
func (r *Relay) register(ctx context.Context) bool {
	ttl := 2*r.cfg.PollInterval + 10*time.Second
	if _, err := r.pool.Exec(ctx, r.q.register, r.id, float64(ttl.Microseconds())); err != nil {
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

// pendingDue reports whether some message is waiting to be published now
// (true when it cannot tell).
func (r *Relay) pendingDue(ctx context.Context) bool {
	var due bool
	if err := r.pool.QueryRow(ctx, r.q.pendingDue).Scan(&due); err != nil {
		return true // cannot tell: look
	}
	return due
}

// listen turns notifications into wake-ups, reconnecting with back-off.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	channelPayload := r.cfg.Schema + "." + r.cfg.Table
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 10*time.Second) {
		conn, err := r.pool.Acquire(ctx)
		if err != nil {
			_ = clock.Sleep(ctx, backoff)
			continue
		}
		if _, err := conn.Exec(ctx, "LISTEN exactly_outbox"); err != nil {
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

// RunOnce makes one pass over the lanes that no other relay holds and
// returns how many messages it published. With nothing due it costs one
// statement.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	if !r.pendingDue(ctx) {
		return 0, nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: relay: %w", err)
	}
	defer conn.Release()
	total := 0
	var errs []error
	for _, lane := range rand.Perm(Lanes) {
		if ctx.Err() != nil {
			break
		}
		var locked bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", r.lockID+int64(lane)).Scan(&locked); err != nil {
			return total, fmt.Errorf("outbox: relay: lane lock: %w", err)
		}
		if !locked {
			continue
		}
		n, err := r.drainLane(ctx, conn.Conn(), lane)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, uerr := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", r.lockID+int64(lane))
		cancel()
		if uerr != nil {
			_ = conn.Conn().Close(uctx) // never return a connection that may hold a lane
			return total, fmt.Errorf("outbox: relay: lane unlock: %w", uerr)
		}
	}
	return total, errors.Join(errs...)
}

type row struct {
	id        int64
	topic     string
	key       string
	uuid      string
	metadata  []byte
	payload   []byte
	attempts  int
	due       bool
	createdAt time.Time
}

func (r *Relay) drainLane(ctx context.Context, conn *pgx.Conn, lane int) (int, error) {
	total := 0
	for {
		n, full, err := r.batch(ctx, conn, lane)
		total += n
		if err != nil || !full || ctx.Err() != nil {
			return total, err
		}
	}
}

// batch publishes one batch of the lane in one transaction.
func (r *Relay) batch(ctx context.Context, conn *pgx.Conn, lane int) (published int, full bool, err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	rows, err := tx.Query(ctx, r.q.fetch, lane, r.cfg.BatchSize)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	var batch []row
	for rows.Next() {
		var x row
		if err := rows.Scan(&x.id, &x.topic, &x.key, &x.uuid, &x.metadata, &x.payload, &x.attempts, &x.due, &x.createdAt); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("outbox: fetch: %w", err)
		}
		batch = append(batch, x)
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	if len(batch) == 0 {
		return 0, false, nil
	}
	ev := BatchEvent{Lane: lane}
	blocked := map[string]bool{} // keys whose earlier message is waiting
	var done []int64
	var oldest time.Time
	// Publish runs of consecutive publishable rows for one topic together.
	// After a failure the scan resumes behind the failed row: later rows of
	// its key are blocked, the others are gathered again.
	for i := 0; i < len(batch); {
		var run []row
		var at []int // run[k] is batch[at[k]]
		j := i
		for ; j < len(batch); j++ {
			x := batch[j]
			if x.key != "" && blocked[x.key] {
				continue
			}
			if !x.due {
				if x.key != "" {
					blocked[x.key] = true
				}
				continue
			}
			if len(run) > 0 && run[0].topic != x.topic {
				break
			}
			run, at = append(run, x), append(at, j)
		}
		if len(run) == 0 {
			break
		}
		ok, failedAt, perr := r.publish(run)
		for _, x := range run[:ok] {
			done = append(done, x.id)
			if oldest.IsZero() || x.createdAt.Before(oldest) {
				oldest = x.createdAt
			}
		}
		if perr == nil {
			i = j
			continue
		}
		dead, err := r.recordFailure(ctx, tx, run[failedAt], perr)
		if err != nil {
			return 0, false, err
		}
		ev.Failed++
		if dead {
			ev.Dead++ // a DEAD message no longer holds up its key
		} else if k := run[failedAt].key; k != "" {
			blocked[k] = true
		}
		i = at[failedAt] + 1
	}
	if len(done) > 0 {
		q := r.q.published
		if r.cfg.DeletePublished {
			q = r.q.deleted
		}
		if _, err := tx.Exec(ctx, q, done); err != nil {
			return 0, false, fmt.Errorf("outbox: mark published: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("outbox: commit: %w", err)
	}
	ev.Published = len(done)
	if !oldest.IsZero() {
		ev.Lag = time.Since(oldest)
	}
	if r.cfg.Hooks != nil {
		r.cfg.Hooks.OnBatch(ctx, ev)
	}
	return len(done), len(batch) == r.cfg.BatchSize && ev.Failed == 0, nil
}

// recordFailure counts a failed attempt of x with back-off, or moves it to
// DEAD after MaxAttempts, and reports which.
func (r *Relay) recordFailure(ctx context.Context, tx pgx.Tx, x row, perr error) (dead bool, err error) {
	backoff := min(r.cfg.RetryBackoff<<min(x.attempts, 20), r.cfg.MaxRetryBackoff)
	var status string
	if err := tx.QueryRow(ctx, r.q.failed, x.id, perr.Error(), float64(backoff.Microseconds()), r.cfg.MaxAttempts).Scan(&status); err != nil {
		return false, fmt.Errorf("outbox: record failure of %s: %w", x.uuid, err)
	}
	if status == "DEAD" {
		r.cfg.Logger.Error("outbox: message is DEAD after repeated publish failures", "uuid", x.uuid, "topic", x.topic, "attempts", x.attempts+1, "err", perr)
		return true, nil
	}
	r.cfg.Logger.Warn("outbox: publish failed; will retry", "uuid", x.uuid, "topic", x.topic, "attempts", x.attempts+1, "backoff", backoff, "err", perr)
	return false, nil
}

// publish sends rows (one topic) and reports how many leading rows went
// out; on failure, failedAt is the row that failed.
func (r *Relay) publish(rows []row) (ok, failedAt int, err error) {
	msgs := make([]*message.Message, len(rows))
	for i, x := range rows {
		m := message.NewMessage(x.uuid, x.payload)
		if err := json.Unmarshal(x.metadata, &m.Metadata); err != nil {
			return i, i, fmt.Errorf("outbox: metadata of %s: %w", x.uuid, err)
		}
		msgs[i] = m
	}
	if err := r.pub.Publish(rows[0].topic, msgs...); err == nil {
		return len(rows), 0, nil
	}
	// Find the failing message, keeping order: one at a time.
	for i, m := range msgs {
		if err := r.pub.Publish(rows[i].topic, m); err != nil {
			return i, i, err
		}
	}
	return len(rows), 0, nil
}

// Cleanup deletes PUBLISHED rows older than PublishedRetention, in batches,
// and returns how many it deleted.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, r.q.cleanup, float64(r.cfg.PublishedRetention.Microseconds()))
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// Stats describes the outbox, for metrics.
type Stats struct {
	Pending int64
	Dead    int64
	// Lag is the age of the oldest pending message; 0 when none.
	Lag time.Duration
}

// Stats reads the outbox's counts and lag.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var oldest *time.Time
	if err := r.pool.QueryRow(ctx, r.q.stats).Scan(&st.Pending, &st.Dead, &oldest); err != nil {
		return st, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil {
		st.Lag = time.Since(*oldest)
	}
	return st, nil
}

package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// marker marks a batch's published rows on a connection of its own while
// the relay publishes the next batch, one batch at a time. The next batch's
// fetch skips the rows being marked; the lanes are let go only after every
// mark committed, so another relay never sees a published row as pending.
type marker struct {
	r      *Relay
	conn   *pgxpool.Conn // nil until the first mark; nil throughout when marking inline
	inline bool
	res    chan error // the mark in flight; nil when none
	ids    []int64    // its rows
	ev     BatchEvent
	oldest time.Time
}

// newMarker marks in the background when the pool has a connection to
// spare (the relay holds one for its lanes and one listens).
func (r *Relay) newMarker() *marker {
	return &marker{r: r, inline: r.pool.Config().MaxConns < 3}
}

// inFlight returns the ids being marked.
func (m *marker) inFlight() []int64 {
	if m.res == nil {
		return []int64{}
	}
	return m.ids
}

// start marks done (ids of published rows, oldest first written at oldest)
// and reports ev when it is marked.
func (m *marker) start(ctx context.Context, ids []int64, ev BatchEvent, oldest time.Time) error {
	m.ids, m.ev, m.oldest = ids, ev, oldest
	res := make(chan error, 1)
	m.res = res
	if len(ids) == 0 || m.inline {
		res <- nil // nothing to mark, or marked in wait on the caller's connection
		return nil
	}
	// Marking records what Kafka already holds: it runs to its end even
	// when ctx is done.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	if m.conn == nil {
		actx, acancel := m.r.bounded(mctx)
		conn, err := m.r.pool.Acquire(actx)
		acancel()
		if err != nil {
			// No connection to spare (or only dead ones): mark on the
			// caller's, which just read and published the batch, rather
			// than leave published rows pending.
			cancel()
			m.inline = true
			res <- nil
			return nil
		}
		m.conn = conn
	}
	go func(conn *pgxpool.Conn) {
		defer cancel()
		res <- m.mark(mctx, conn)
	}(m.conn)
	return nil
}

func (m *marker) mark(ctx context.Context, conn *pgxpool.Conn) error {
	q := m.r.q.published
	if m.r.cfg.DeletePublished {
		q = m.r.q.deleted
	}
	if _, err := conn.Exec(ctx, q, m.ids); err != nil {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	return nil
}

// wait waits for the mark in flight (running it on conn when marking
// inline) and reports its batch to the hooks.
func (m *marker) wait(ctx context.Context, conn *pgxpool.Conn) error {
	if m.res == nil {
		return nil
	}
	res := m.res
	m.res = nil
	var err error
	if err = <-res; err == nil && m.inline && len(m.ids) > 0 {
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = m.mark(mctx, conn)
		cancel()
	}
	if err != nil {
		return err
	}
	ev := m.ev
	ev.Published = len(m.ids)
	if !m.oldest.IsZero() {
		ev.Lag = time.Since(m.oldest)
	}
	if m.r.cfg.Hooks != nil {
		m.r.cfg.Hooks.OnBatch(ctx, ev)
	}
	return nil
}

// close waits for the mark in flight and gives its connection back.
func (m *marker) close(ctx context.Context, conn *pgxpool.Conn) error {
	err := m.wait(ctx, conn)
	if m.conn != nil {
		m.conn.Release()
		m.conn = nil
	}
	return err
}

package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type row struct {
	id        int64
	lane      int16
	topic     string
	key       string
	uuid      string
	metadata  []byte
	payload   []byte
	attempts  int
	createdAt time.Time
}

// batch publishes at most BatchSize rows that are due in lanes, hands
// them to m to be marked, and returns the lanes that may have more. It
// reads up to twice as many rows as it publishes (shared evenly by the
// lanes), so that a round holds many keys (see publishInOrder).
//
// It needs no transaction: the lanes' locks keep every other relay away,
// and each statement is atomic. A relay that dies before it marks what it
// published leaves those rows pending, to be published again.
func (r *Relay) batch(ctx context.Context, conn *pgxpool.Conn, lanes []int, m *marker) (published int, more []int, err error) {
	perLane := max((2*r.cfg.BatchSize+len(lanes)-1)/len(lanes), 1)
	rows, err := r.fetch(ctx, conn.Conn(), lanes, perLane, m.inFlight())
	if err != nil {
		return 0, nil, err
	}
	if len(rows) == 0 {
		return 0, nil, nil
	}
	ev := BatchEvent{Lanes: lanes}
	done, left, err := r.publishInOrder(ctx, conn.Conn(), rows, &ev)
	if err != nil {
		return 0, nil, err
	}
	read := map[int16]int{}
	for _, x := range rows {
		read[x.lane]++
	}
	for _, x := range left {
		read[x.lane] = perLane
	}
	for _, l := range lanes {
		if read[int16(l)] >= perLane {
			more = append(more, l)
		}
	}
	var oldest time.Time
	ids := make([]int64, len(done))
	for i, x := range done {
		ids[i] = x.id
		if oldest.IsZero() || x.createdAt.Before(oldest) {
			oldest = x.createdAt
		}
	}
	// The previous batch is marked before this one: a row is never
	// PUBLISHED before the rows of its key published ahead of it.
	if err := m.wait(ctx, conn); err != nil {
		return 0, nil, err
	}
	if err := m.start(ctx, ids, ev, oldest); err != nil {
		return 0, nil, err
	}
	return len(done), more, nil
}

// fetch reads up to perLane rows of each lane, in id order.
// Rows being marked (skip) are left out.
func (r *Relay) fetch(ctx context.Context, conn *pgx.Conn, lanes []int, perLane int, skip []int64) ([]row, error) {
	rs, err := conn.Query(ctx, r.q.fetch, laneOrder(lanes), perLane, skip)
	if err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var x row
		if err := rs.Scan(&x.id, &x.lane, &x.topic, &x.key, &x.uuid, &x.metadata, &x.payload, &x.attempts, &x.createdAt); err != nil {
			return nil, fmt.Errorf("outbox: fetch: %w", err)
		}
		out = append(out, x)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	slices.SortFunc(out, func(a, b row) int { return int(min(max(a.id-b.id, -1), 1)) })
	return out, nil
}

// publishInOrder publishes rows in rounds: a round holds the first
// unpublished row of every key, so a message goes to the publisher only
// after the publisher acknowledged every earlier message of its key, and
// a rejected message never has a later message of its key sent beside it
// (a publisher such as kafka-go's Writer splits one call into several
// requests and goes on after one fails). A failed row holds its key for
// the rest of the batch. A round costs a publisher round trip whatever its
// size, so once rounds shrink to less than half the first, or BatchSize
// rows went out, the rows left wait for the next batch, where they share
// a round with other keys. It returns the rows published, in order, and
// those left.
func (r *Relay) publishInOrder(ctx context.Context, conn *pgx.Conn, rows []row, ev *BatchEvent) (done, left []row, err error) {
	queues := map[string][]row{}
	var keys []string // in order of each key's first row
	for _, x := range rows {
		k := x.key
		if k == "" {
			k = "\x00" + x.uuid // no key, no order: a queue of its own (text never holds NUL)
		}
		if _, ok := queues[k]; !ok {
			keys = append(keys, k)
		}
		queues[k] = append(queues[k], x)
	}
	first := 0
	for {
		var round []row
		live := keys[:0]
		for _, k := range keys {
			if q := queues[k]; len(q) > 0 {
				live = append(live, k)
			}
		}
		keys = live
		for _, k := range keys {
			if len(done)+len(round) == r.cfg.BatchSize {
				break
			}
			round = append(round, queues[k][0])
		}
		if len(round) == 0 || 2*len(round) < first {
			for _, k := range keys {
				left = append(left, queues[k]...)
			}
			return done, left, nil
		}
		first = max(first, len(round))
		errs := r.publishRound(round)
		for i, x := range round {
			k := keys[i]
			if errs[i] == nil {
				done = append(done, x)
				queues[k] = queues[k][1:]
				continue
			}
			dead, err := r.recordFailure(ctx, conn, x, errs[i])
			if err != nil {
				return nil, nil, err
			}
			ev.Failed++
			if dead {
				ev.Dead++
			}
			queues[k] = nil // held: its later rows wait for a later batch
		}
	}
}

// publishRound publishes rows (of distinct keys), one call per topic, and
// returns each row's error. Rows that failed before, and every row of a
// call that failed, are published one at a time, so that one rejected
// message costs no other message its publication.
func (r *Relay) publishRound(rows []row) []error {
	errs := make([]error, len(rows))
	msgs := make([]*message.Message, len(rows))
	byTopic := map[string][]int{}
	var topics []string
	for i, x := range rows {
		if msgs[i], errs[i] = toMessage(x); errs[i] != nil {
			continue
		}
		if x.attempts > 0 {
			errs[i] = r.pub.Publish(x.topic, msgs[i])
			continue
		}
		if _, ok := byTopic[x.topic]; !ok {
			topics = append(topics, x.topic)
		}
		byTopic[x.topic] = append(byTopic[x.topic], i)
	}
	for _, topic := range topics {
		at := byTopic[topic]
		call := make([]*message.Message, len(at))
		for j, i := range at {
			call[j] = msgs[i]
		}
		if err := r.pub.Publish(topic, call...); err == nil || len(at) == 1 {
			for _, i := range at {
				errs[i] = err
			}
			continue
		}
		for _, i := range at {
			errs[i] = r.pub.Publish(topic, msgs[i])
		}
	}
	return errs
}

func toMessage(x row) (*message.Message, error) {
	m := message.NewMessage(x.uuid, x.payload)
	if err := json.Unmarshal(x.metadata, &m.Metadata); err != nil {
		return nil, fmt.Errorf("outbox: metadata of %s: %w", x.uuid, err)
	}
	return m, nil
}

// recordFailure counts a failed attempt of x with back-off, or moves it to
// DEAD after MaxAttempts, and reports which.
func (r *Relay) recordFailure(ctx context.Context, conn *pgx.Conn, x row, perr error) (dead bool, err error) {
	backoff := min(r.cfg.RetryBackoff<<min(x.attempts, 20), r.cfg.MaxRetryBackoff)
	var status string
	if err := conn.QueryRow(ctx, r.q.failed, x.id, perr.Error(), float64(backoff.Microseconds()), r.cfg.MaxAttempts).Scan(&status); err != nil {
		return false, fmt.Errorf("outbox: record failure of %s: %w", x.uuid, err)
	}
	if status == "DEAD" {
		r.cfg.Logger.Error("outbox: message is DEAD after repeated publish failures; later messages of its key wait until it is retried or removed",
			"uuid", x.uuid, "topic", x.topic, "key", x.key, "attempts", x.attempts+1, "err", perr)
		return true, nil
	}
	r.cfg.Logger.Warn("outbox: publish failed; will retry", "uuid", x.uuid, "topic", x.topic, "attempts", x.attempts+1, "backoff", backoff, "err", perr)
	return false, nil
}

package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
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

// prefetch is the next batch's read, made while a batch publishes.
type prefetch struct {
	lanes   []int
	perLane int
	rows    []row
	err     error
	done    chan struct{}
}

// batch publishes at most BatchSize rows that are due in lanes, hands
// them to m to be marked, and returns the lanes that may have more. It
// reads up to twice as many rows as it publishes (shared evenly by the
// lanes), so that a round holds many keys (see publishInOrder).
//
// While its first round publishes, it reads the next batch (next), leaving
// out the rows in that round and those being marked; once the batch is
// done it drops from that read the rows it published and every row of a
// key that failed. pf, when not nil, is this batch's read.
//
// It needs no transaction: the lanes' locks keep every other relay away,
// and each statement is atomic. A relay that dies before it marks what it
// published leaves those rows pending, to be published again.
func (r *Relay) batch(ctx context.Context, conn *pgxpool.Conn, lanes []int, m *marker, pf *prefetch) (published int, more []int, next *prefetch, err error) {
	perLane := max((2*r.cfg.BatchSize+len(lanes)-1)/len(lanes), 1)
	var rows []row
	if pf != nil && pf.err == nil && isSubset(lanes, pf.lanes) {
		perLane = pf.perLane
		rows = slices.DeleteFunc(pf.rows, func(x row) bool { return !slices.Contains(lanes, int(x.lane)) })
	} else if rows, err = r.fetch(ctx, conn.Conn(), lanes, perLane, m.inFlight()); err != nil {
		return 0, nil, nil, err
	}
	if len(rows) == 0 {
		return 0, nil, nil, nil
	}
	ev := BatchEvent{Lanes: lanes}
	read := func(round []row) {
		skip := slices.Clone(m.inFlight())
		for _, x := range round {
			skip = append(skip, x.id)
		}
		next = &prefetch{lanes: lanes, perLane: perLane, done: make(chan struct{})}
		go func(p *prefetch) {
			defer close(p.done)
			p.rows, p.err = r.fetch(ctx, conn.Conn(), lanes, perLane, skip)
		}(next)
	}
	join := func() {
		if next != nil {
			<-next.done
		}
	}
	done, left, held, err := r.publishInOrder(ctx, conn.Conn(), rows, &ev, read, join)
	join()
	if err != nil {
		return 0, nil, nil, err
	}
	counts := map[int16]int{}
	for _, x := range rows {
		counts[x.lane]++
	}
	for _, x := range left {
		counts[x.lane] = perLane
	}
	for _, l := range lanes {
		if counts[int16(l)] >= perLane {
			more = append(more, l)
		}
	}
	var oldest time.Time
	ids := make([]int64, len(done))
	sent := map[int64]bool{}
	for i, x := range done {
		ids[i] = x.id
		sent[x.id] = true
		if oldest.IsZero() || x.createdAt.Before(oldest) {
			oldest = x.createdAt
		}
	}
	if next != nil && next.err == nil {
		next.rows = slices.DeleteFunc(next.rows, func(x row) bool { return sent[x.id] || held[queueKey(x)] })
	}
	// The previous batch is marked before this one: a row is never
	// PUBLISHED before the rows of its key published ahead of it.
	if err := m.wait(ctx, conn); err != nil {
		return 0, nil, nil, err
	}
	if err := m.start(ctx, ids, ev, oldest); err != nil {
		return 0, nil, nil, err
	}
	return len(done), more, next, nil
}

func isSubset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// queueKey is the key that orders x: its partition key, or, without one,
// a key of its own (text never holds NUL).
func queueKey(x row) string {
	if x.key == "" {
		return "\x00" + x.uuid
	}
	return x.key
}

// fetch reads up to perLane rows of each lane, in id order.
// Rows being marked (skip) are left out.
func (r *Relay) fetch(ctx context.Context, conn *pgx.Conn, lanes []int, perLane int, skip []int64) ([]row, error) {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
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
// a round with other keys. It returns the rows published, in order, those
// left and the keys held by a failure. It calls first with the first round
// before publishing it, and after once each round is published, before
// it uses conn again.
func (r *Relay) publishInOrder(ctx context.Context, conn *pgx.Conn, rows []row, ev *BatchEvent, first func([]row), after func()) (done, left []row, held map[string]bool, err error) {
	queues := map[string][]row{}
	held = map[string]bool{}
	var keys []string // in order of each key's first row
	for _, x := range rows {
		k := queueKey(x)
		if _, ok := queues[k]; !ok {
			keys = append(keys, k)
		}
		queues[k] = append(queues[k], x)
	}
	firstSize := 0
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
		if len(round) == 0 || 2*len(round) < firstSize {
			for _, k := range keys {
				left = append(left, queues[k]...)
			}
			return done, left, held, nil
		}
		if firstSize == 0 {
			first(round)
		}
		firstSize = max(firstSize, len(round))
		errs := r.publishRound(round)
		after()
		for i, x := range round {
			k := keys[i]
			if errs[i] == nil {
				done = append(done, x)
				queues[k] = queues[k][1:]
				continue
			}
			dead, err := r.recordFailure(ctx, conn, x, errs[i])
			if err != nil {
				return nil, nil, nil, err
			}
			ev.Failed++
			if infrastructure(errs[i]) {
				ev.Unavailable++
			}
			if dead {
				ev.Dead++
			}
			queues[k] = nil // held: its later rows wait for a later batch
			held[k] = true
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

// infrastructure reports whether a publish failed because of the
// infrastructure, not the message: a topic that does not exist (yet), a
// broker out of reach or not answering in time, an error the publisher
// marked retryable or temporary.
func infrastructure(err error) bool {
	// Not net.Error: kafka-go's error codes have Timeout and Temporary
	// too, the permanent ones (a record too large) included.
	var operr *net.OpError
	switch {
	case dedupe.IsRetryable(err), errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &operr):
		return true
	}
	// Publishers of other clients, and kafka-go's WriteErrors, which
	// errors.As does not look into.
	s := strings.ToLower(err.Error())
	for _, sign := range []string{"unknown topic or partition", "unknown_topic_or_partition", "leader not available",
		"not_leader_or_follower", "not leader for partition", "connection refused", "broker not available", "i/o timeout"} {
		if strings.Contains(s, sign) {
			return true
		}
	}
	return false
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
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	maxAttempts := r.cfg.MaxAttempts
	infra := infrastructure(perr)
	if infra {
		// Not the message's fault: it is retried until the topic exists
		// or the broker answers, never DEAD.
		maxAttempts = math.MaxInt32
	}
	var status string
	if err := conn.QueryRow(ctx, r.q.failed, x.id, perr.Error(), float64(backoff.Microseconds()), maxAttempts).Scan(&status); err != nil {
		return false, fmt.Errorf("outbox: record failure of %s: %w", x.uuid, err)
	}
	if infra {
		r.cfg.Logger.Error("outbox: publish failed: the topic does not exist or the broker is out of reach; retried until it "+
			"succeeds, never DEAD, and the later messages of its key wait behind it: create the topic (or fix the brokers)",
			"uuid", x.uuid, "topic", x.topic, "key", x.key, "attempts", x.attempts+1, "backoff", backoff, "err", perr)
		return false, nil
	}
	if status == "DEAD" {
		r.cfg.Logger.Error("outbox: message is DEAD after repeated publish failures; later messages of its key wait until it is retried or removed",
			"uuid", x.uuid, "topic", x.topic, "key", x.key, "attempts", x.attempts+1, "err", perr)
		return true, nil
	}
	r.cfg.Logger.Warn("outbox: publish failed; will retry", "uuid", x.uuid, "topic", x.topic, "attempts", x.attempts+1, "backoff", backoff, "err", perr)
	return false, nil
}

// Package redrive publishes dead letters back to the topic each came from,
// recording each redrive in exactly_redrives (migration 00010) so that a
// second redrive skips it: the one implementation of `replay redrive` and
// of the console's redrive action.
package redrive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"

	"github.com/exactly-go/exactly/internal/kafkaadmin"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// ErrDatabase wraps the errors of the database that records the redrives.
var ErrDatabase = errors.New("database")

// Letter is one dead-letter record.
type Letter struct {
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	Time      time.Time `json:"time"`
	Key       string    `json:"key,omitempty"`
	ID        string    `json:"message_id,omitempty"`
	// Source is the topic it was consumed from (topic_poisoned), Handler
	// the handler that refused it and Reason why.
	Source  string `json:"source_topic,omitempty"`
	Handler string `json:"handler,omitempty"`
	Reason  string `json:"reason"`
	// RedrivenAt is when it was redriven (nil: never, or not known
	// without a database).
	RedrivenAt *time.Time `json:"redriven_at,omitempty"`
	// Outcome is what this run did with it: "redriven", "already
	// redriven", "no source topic" or "" (listed only).
	Outcome string `json:"outcome,omitempty"`
	// Uncertain is set when its redrive failed or outlived its deadline:
	// the letter may have been published, and is published again only
	// when forced.
	Uncertain bool `json:"uncertain,omitempty"`
	// OffsetReused is set when a letter with another message ID was
	// redriven from this offset before: the topic was deleted and created
	// again. It does not stop this letter's redrive.
	OffsetReused bool `json:"offset_reused,omitempty"`

	// Record is the dead-letter record as read.
	Record kafka.Message `json:"-"`
}

// poisonHeaders are the headers a PoisonQueue adds to a dead letter.
var poisonHeaders = []string{middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey,
	middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey}

// Of reads a dead letter's reason headers.
func Of(m kafka.Message) Letter {
	l := Letter{Partition: m.Partition, Offset: m.Offset, Time: m.Time, Key: string(m.Key), Record: m}
	for _, h := range m.Headers {
		switch h.Key {
		case kafkapubsub.UUIDHeader:
			l.ID = string(h.Value)
		case middleware.ReasonForPoisonedKey:
			l.Reason = string(h.Value)
		case middleware.PoisonedTopicKey:
			l.Source = string(h.Value)
		case middleware.PoisonedHandlerKey:
			l.Handler = string(h.Value)
		}
	}
	return l
}

// Table is the quoted name of exactly_redrives in schema.
func Table(schema string) string { return pgx.Identifier{schema, "exactly_redrives"}.Sanitize() }

// Mark sets RedrivenAt and Uncertain on the letters of topic that table
// holds, and OffsetReused on those whose offset a letter with another
// message ID was redriven from (the topic was deleted and created again).
func Mark(ctx context.Context, pool *pgxpool.Pool, table, topic string, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	parts, offs := make([]int32, len(letters)), make([]int64, len(letters))
	for i, l := range letters {
		parts[i], offs[i] = int32(l.Partition), l.Offset
	}
	rows, err := pool.Query(ctx, "SELECT r.dlq_partition, r.dlq_offset, r.message_id, r.state, r.redriven_at FROM "+table+" r "+
		"JOIN unnest($2::int[], $3::bigint[]) AS l(p, o) ON r.dlq_partition = l.p AND r.dlq_offset = l.o WHERE r.dlq_topic = $1",
		topic, parts, offs)
	if err != nil {
		return err
	}
	defer rows.Close()
	type at struct {
		p int32
		o int64
	}
	type row struct {
		id, state string
		ts        time.Time
	}
	seen := map[at][]row{}
	for rows.Next() {
		var (
			a at
			r row
		)
		if err := rows.Scan(&a.p, &a.o, &r.id, &r.state, &r.ts); err != nil {
			return err
		}
		seen[a] = append(seen[a], r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range letters {
		l := &letters[i]
		for _, r := range seen[at{int32(l.Partition), l.Offset}] {
			if r.id != l.ID {
				l.OffsetReused = true
				continue
			}
			l.RedrivenAt, l.Uncertain = &r.ts, r.state == StateUncertain
		}
	}
	return nil
}

// The states of a row of exactly_redrives.
const (
	// StatePublished: the letter was published (the broker acknowledged it).
	StatePublished = "published"
	// StateUncertain: its publish failed or outlived its deadline, and may
	// have reached the broker all the same.
	StateUncertain = "uncertain"
)

// ErrUncertain marks a redrive whose publish may or may not have reached
// the broker: it is recorded as uncertain, and a second redrive does not
// publish the letter again unless forced.
var ErrUncertain = errors.New("may have been published")

// One records l in table, publishes it to target with w and commits;
// false when another redrive recorded it first. The record goes out as it
// arrived at its source topic: key, value and headers (the message ID
// among them), without the dead-letter headers. Only one connection of
// pool is held, and no other is waited for while it is.
//
// A publish that fails or outlives ctx may have reached the broker all the
// same: One then commits the row as uncertain and returns an error wrapping
// ErrUncertain. A letter recorded as uncertain is not published again (an
// error wrapping ErrUncertain) unless force is set: the worker's keys
// absorb a second copy, but a redrive publishes a letter once.
func One(ctx context.Context, pool *pgxpool.Pool, table string, w *kafka.Writer, dlq, target string, l *Letter, force bool) (bool, error) {
	where := fmt.Sprintf("%s/%d/%d", dlq, l.Partition, l.Offset)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrDatabase, err)
	}
	// after is a context for the statements that follow the publish: ctx
	// may have expired during it.
	after := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	}
	defer func() {
		rctx, cancel := after()
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	key := "dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND message_id = $4"
	var ts time.Time
	err = tx.QueryRow(ctx, "INSERT INTO "+table+" (dlq_topic, dlq_partition, dlq_offset, message_id, record_key, target_topic, reason) "+
		"VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING redriven_at",
		dlq, l.Partition, l.Offset, l.ID, l.Record.Key, target, l.Reason).Scan(&ts)
	if errors.Is(err, pgx.ErrNoRows) {
		var state string
		err = tx.QueryRow(ctx, "SELECT state FROM "+table+" WHERE "+key, dlq, l.Partition, l.Offset, l.ID).Scan(&state)
		if err != nil {
			return false, fmt.Errorf("%w: read the redrive of %s: %v", ErrDatabase, where, err)
		}
		if state != StateUncertain {
			return false, nil
		}
		if !force {
			return false, fmt.Errorf("%w: an earlier redrive of %s failed and may have been published (the worker's keys absorb a copy); "+
				"force it (replay redrive --force, the console's Force button) to publish it again", ErrUncertain, where)
		}
		// Forced: take the uncertain row (a second forced redrive waits
		// here, then finds it published).
		err = tx.QueryRow(ctx, "UPDATE "+table+" SET state = $5, redriven_at = now(), target_topic = $6 WHERE "+key+" AND state = $7 "+
			"RETURNING redriven_at", dlq, l.Partition, l.Offset, l.ID, StatePublished, target, StateUncertain).Scan(&ts)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("%w: record the redrive of %s: %v", ErrDatabase, where, err)
	}
	out := kafka.Message{Topic: target, Key: l.Record.Key, Value: l.Record.Value, Headers: withoutPoisonHeaders(l.Record.Headers)}
	if perr := w.WriteMessages(ctx, out); perr != nil {
		actx, cancel := after()
		defer cancel()
		_, err := tx.Exec(actx, "UPDATE "+table+" SET state = $5 WHERE "+key, dlq, l.Partition, l.Offset, l.ID, StateUncertain)
		if err == nil {
			err = tx.Commit(actx)
		}
		if err != nil {
			return false, fmt.Errorf("%w: publish %s to %s failed (%v) and may have been published all the same; "+
				"recording it as uncertain failed too (a second redrive publishes it again; the worker's keys absorb a copy): %v",
				ErrUncertain, where, target, perr, err)
		}
		l.RedrivenAt, l.Uncertain = &ts, true
		return false, fmt.Errorf("%w: publish %s to %s failed (%v), yet it may have reached the broker: it is recorded as uncertain "+
			"and the worker's keys absorb a copy; force a redrive (replay redrive --force, the console's Force button) to publish it again",
			ErrUncertain, where, target, perr)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("%w: %s was published to %s but its record did not commit (a second redrive publishes it again; "+
			"the worker's keys absorb it): %v", ErrDatabase, where, target, err)
	}
	l.RedrivenAt, l.Uncertain = &ts, false
	return true, nil
}

// NewWriter returns the Writer that One publishes with: acks=all and one
// attempt, for a retry inside the Writer could publish a letter twice (the
// worker's keys would absorb the copy, but a redrive publishes once; a
// failed publish is recorded as uncertain instead).
func NewWriter(brokers []string, sec kafkapubsub.Security) *kafka.Writer {
	return &kafka.Writer{Addr: kafka.TCP(brokers...), Balancer: &kafka.Murmur2Balancer{}, Transport: sec.Transport(),
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, MaxAttempts: 1}
}

// withoutPoisonHeaders returns hs, in order, without the dead-letter
// headers: the record as it arrived at its source topic.
func withoutPoisonHeaders(hs []kafka.Header) []kafka.Header {
	out := hs[:0:0]
	for _, h := range hs {
		if !slices.Contains(poisonHeaders, h.Key) {
			out = append(out, kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
		}
	}
	return out
}

// Span is the offsets [From, To) of one partition.
type Span struct {
	Partition int
	From, To  int64
}

// Recent returns the spans of the last n records of each partition of
// topic (fewer where the log holds fewer).
func Recent(ctx context.Context, c *kafka.Client, topic string, n int64) ([]Span, error) {
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts := 0
	for _, t := range md.Topics {
		if t.Name == topic {
			if t.Error != nil {
				return nil, fmt.Errorf("metadata of %s: %w", topic, t.Error)
			}
			parts = len(t.Partitions)
		}
	}
	reqs := make([]kafka.OffsetRequest, 0, 2*parts)
	for p := range parts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	if parts == 0 {
		return nil, nil
	}
	offs, err := kafkaadmin.ListOffsets(ctx, c, topic, reqs)
	if err != nil {
		return nil, err
	}
	spans := make([]Span, 0, parts)
	for p := range parts {
		o := offs[p]
		spans = append(spans, Span{Partition: p, From: max(o.FirstOffset, o.LastOffset-n), To: o.LastOffset})
	}
	return spans, nil
}

// Read calls each with the committed records of topic in spans, a
// partition at a time each, and the partitions at once. It reads
// read-committed, as a consumer with isolation.level=read_committed does:
// a letter written in a transaction that was aborted (a Kafka Streams or
// Connect dead-letter queue with exactly-once, a transactional producer)
// is not a letter, and the transactions' markers are not records. A span
// ends at the partition's last stable offset at the latest: a letter of a
// transaction still open is not read.
func Read(ctx context.Context, brokers []string, sec kafkapubsub.Security, topic string, spans []Span, each func(kafka.Message) error) error {
	return ReadLimited(ctx, brokers, sec, topic, spans, 0, each)
}

// ReadLimited is Read with each fetch capped to maxBytes (0: 10 MB).
func ReadLimited(ctx context.Context, brokers []string, sec kafkapubsub.Security, topic string, spans []Span, maxBytes int32,
	each func(kafka.Message) error) error {
	if maxBytes <= 0 {
		maxBytes = 10 << 20
	}
	var wg sync.WaitGroup
	errs := make([]error, len(spans))
	for i, s := range spans {
		if s.To <= s.From {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = readSpan(ctx, brokers, sec, topic, s, maxBytes, each)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func readSpan(ctx context.Context, brokers []string, sec kafkapubsub.Security, topic string, s Span, maxBytes int32,
	each func(kafka.Message) error) error {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100 * time.Millisecond), kgo.FetchMaxBytes(maxBytes), kgo.FetchMaxPartitionBytes(maxBytes),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {int32(s.Partition): kgo.NewOffset().At(s.From)}})}
	if sec.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(sec.TLS.Clone()))
	}
	if sec.SASL != nil {
		opts = append(opts, kgo.SASL(saslOf{sec.SASL}))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("read %s/%d: %w", topic, s.Partition, err)
	}
	defer cl.Close()
	// The span ends at the last stable offset: past it, a read-committed
	// fetch returns nothing until the open transaction ends.
	lso, err := lastStable(ctx, cl, topic, int32(s.Partition))
	if err != nil {
		return fmt.Errorf("read %s/%d: %w", topic, s.Partition, err)
	}
	to := min(s.To, lso)
	if to <= s.From {
		return nil
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s/%d: %w", topic, s.Partition, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) { ferr = errors.Join(ferr, fmt.Errorf("read %s/%d: %w", t, p, err)) })
		if ferr != nil {
			return ferr
		}
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			if r.Offset >= to {
				return nil
			}
			if !r.Attrs.IsControl() {
				if err := each(messageOf(r)); err != nil {
					return err
				}
			}
			if r.Offset+1 >= to {
				return nil
			}
		}
	}
}

// lastStable asks the partition's leader for its last stable offset.
func lastStable(ctx context.Context, cl *kgo.Client, topic string, p int32) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = p, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("last stable offset: %w", err)
	}
	for _, t := range res.Topics {
		for _, rp := range t.Partitions {
			if rp.Partition == p {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return 0, fmt.Errorf("last stable offset: %w", err)
				}
				return rp.Offset, nil
			}
		}
	}
	return 0, errors.New("last stable offset: the partition did not answer")
}

func messageOf(r *kgo.Record) kafka.Message {
	m := kafka.Message{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Timestamp}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	return m
}

// saslOf lets franz-go authenticate with a kafka-go SASL mechanism.
type saslOf struct{ m sasl.Mechanism }

func (s saslOf) Name() string { return s.m.Name() }

func (s saslOf) Authenticate(ctx context.Context, _ string) (kgosasl.Session, []byte, error) {
	sess, first, err := s.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return saslSession{ctx: ctx, s: sess}, first, nil
}

type saslSession struct {
	ctx context.Context
	s   sasl.StateMachine
}

func (s saslSession) Challenge(c []byte) (bool, []byte, error) { return s.s.Next(s.ctx, c) }

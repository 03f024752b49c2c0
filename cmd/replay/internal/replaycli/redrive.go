package replaycli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// RedriveConfig configures Redrive.
type RedriveConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security kafkapubsub.Security
	// DeadLetterTopic is the topic to list and redrive. Required.
	DeadLetterTopic string
	// Range selects the dead-letter records by partition, offset or time.
	Range Range
	// Reason keeps the letters whose reason contains it. Key keeps the
	// letters with this record key, ID those with this message ID.
	// Default to every letter.
	Reason, Key, ID string
	// To publishes the letters to this topic instead of the one each came
	// from (its topic_poisoned header). Defaults to the source topic.
	To string
	// Execute publishes the selected letters that were not redriven yet.
	// Defaults to false: list only.
	Execute bool
	// DatabaseURL is the database whose exactly_redrives table records the
	// redrives (migration 00010). Required with Execute; without it the
	// list does not say what was redriven.
	DatabaseURL string
	// Schema holds exactly_redrives. Defaults to the database URL's
	// search_path, else public.
	Schema string
}

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

	record kafka.Message
}

// RedriveReport lists the selected letters and what was done.
type RedriveReport struct {
	DeadLetterTopic string   `json:"dead_letter_topic"`
	Read            int      `json:"read"`
	Letters         []Letter `json:"letters"`
	Executed        bool     `json:"executed"`
	Redriven        int      `json:"redriven"`
	Skipped         int      `json:"skipped"`
}

// afterList, when set (by tests), runs between the list and the first
// publish.
var afterList func()

// poisonHeaders are the headers a PoisonQueue adds to a dead letter.
var poisonHeaders = []string{middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey,
	middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey}

// Redrive lists a dead-letter topic's records with their reasons and, with
// Execute, publishes the selected ones back to the topic each came from as
// it arrived there: key, value and headers (the message ID among them),
// without the dead-letter headers. Each redriven record is recorded in
// exactly_redrives in a transaction committed after its publish, so a
// second run skips it; if that commit is lost, the record is published
// again with the same message ID, and the consumer's keys absorb it.
func Redrive(ctx context.Context, o RedriveConfig) (RedriveReport, error) {
	rep := RedriveReport{DeadLetterTopic: o.DeadLetterTopic, Executed: o.Execute}
	switch {
	case o.DeadLetterTopic == "":
		return rep, fmt.Errorf("%w: --dlq is required: the dead-letter topic", errUsage)
	case o.Execute && o.DatabaseURL == "":
		return rep, fmt.Errorf("%w: --execute needs --database-url (or DATABASE_URL): the redrives are recorded in its exactly_redrives table", errUsage)
	case o.To == o.DeadLetterTopic:
		return rep, fmt.Errorf("%w: --to is the dead-letter topic %s itself", errUsage, o.To)
	}
	var (
		pool  *pgxpool.Pool
		table string
	)
	if o.DatabaseURL != "" {
		var err error
		if pool, err = pgxpool.New(ctx, o.DatabaseURL); err == nil {
			err = pool.Ping(ctx)
		}
		if err != nil {
			return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
		}
		defer pool.Close()
		if o.Schema == "" {
			o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
		}
		table = pgx.Identifier{o.Schema, "exactly_redrives"}.Sanitize()
	}
	k := newKafka(o.Brokers, o.Security)
	spans, err := k.resolve(ctx, o.DeadLetterTopic, o.Range)
	if err != nil {
		return rep, err
	}
	var mu sync.Mutex
	err = k.read(ctx, o.DeadLetterTopic, spans, func(m kafka.Message) error {
		l := letterOf(m)
		mu.Lock()
		defer mu.Unlock()
		rep.Read++
		if o.Reason != "" && !strings.Contains(l.Reason, o.Reason) || o.Key != "" && l.Key != o.Key || o.ID != "" && l.ID != o.ID {
			return nil
		}
		rep.Letters = append(rep.Letters, l)
		return nil
	})
	if err != nil {
		return rep, err
	}
	slices.SortFunc(rep.Letters, func(a, b Letter) int {
		if c := a.Time.Compare(b.Time); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return int(a.Offset - b.Offset)
	})
	if pool != nil {
		if err := markRedriven(ctx, pool, table, o.DeadLetterTopic, rep.Letters); err != nil {
			return rep, fmt.Errorf("%w: %v (run the migrations: exactly_redrives is migration 00010)", errDatabase, redact.Error(err, o.DatabaseURL))
		}
	}
	if !o.Execute {
		return rep, nil
	}
	if afterList != nil {
		afterList()
	}
	w := &kafka.Writer{Addr: kafka.TCP(o.Brokers...), Balancer: &kafka.Murmur2Balancer{}, Transport: o.Security.Transport(),
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, MaxAttempts: 10}
	defer w.Close()
	for i := range rep.Letters {
		l := &rep.Letters[i]
		target := o.To
		if target == "" {
			target = l.Source
		}
		switch {
		case l.RedrivenAt != nil:
			l.Outcome = "already redriven"
			rep.Skipped++
			continue
		case target == "":
			l.Outcome = "no source topic (give --to)"
			rep.Skipped++
			continue
		case target == o.DeadLetterTopic:
			l.Outcome = "source is the dead-letter topic"
			rep.Skipped++
			continue
		}
		done, err := redriveOne(ctx, pool, table, w, o.DeadLetterTopic, target, l)
		if err != nil {
			return rep, err
		}
		if done {
			l.Outcome = "redriven"
			rep.Redriven++
		} else {
			l.Outcome = "already redriven"
			rep.Skipped++
		}
	}
	return rep, nil
}

// letterOf reads a dead letter's reason headers.
func letterOf(m kafka.Message) Letter {
	l := Letter{Partition: m.Partition, Offset: m.Offset, Time: m.Time, Key: string(m.Key), record: m}
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

// markRedriven sets RedrivenAt on the letters exactly_redrives holds.
func markRedriven(ctx context.Context, pool *pgxpool.Pool, table, topic string, letters []Letter) error {
	if len(letters) == 0 {
		return nil
	}
	parts, offs := make([]int32, len(letters)), make([]int64, len(letters))
	for i, l := range letters {
		parts[i], offs[i] = int32(l.Partition), l.Offset
	}
	rows, err := pool.Query(ctx, "SELECT r.dlq_partition, r.dlq_offset, r.redriven_at FROM "+table+" r "+
		"JOIN unnest($2::int[], $3::bigint[]) AS l(p, o) ON r.dlq_partition = l.p AND r.dlq_offset = l.o WHERE r.dlq_topic = $1",
		topic, parts, offs)
	if err != nil {
		return err
	}
	type at struct {
		p int32
		o int64
	}
	seen := map[at]time.Time{}
	for rows.Next() {
		var (
			a  at
			ts time.Time
		)
		if err := rows.Scan(&a.p, &a.o, &ts); err != nil {
			return err
		}
		seen[a] = ts
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range letters {
		if ts, ok := seen[at{int32(letters[i].Partition), letters[i].Offset}]; ok {
			letters[i].RedrivenAt = &ts
		}
	}
	return nil
}

// redriveOne records l in exactly_redrives, publishes it to target and
// commits; false when another redrive recorded it first.
func redriveOne(ctx context.Context, pool *pgxpool.Pool, table string, w *kafka.Writer, dlq, target string, l *Letter) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errDatabase, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	var id *string
	if l.ID != "" {
		id = &l.ID
	}
	var ts time.Time
	err = tx.QueryRow(ctx, "INSERT INTO "+table+" (dlq_topic, dlq_partition, dlq_offset, message_id, record_key, target_topic, reason) "+
		"VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING redriven_at",
		dlq, l.Partition, l.Offset, id, l.record.Key, target, l.Reason).Scan(&ts)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: record the redrive of %s/%d/%d: %v", errDatabase, dlq, l.Partition, l.Offset, err)
	}
	out := kafka.Message{Topic: target, Key: l.record.Key, Value: l.record.Value, Headers: withoutPoisonHeaders(l.record.Headers)}
	if err := w.WriteMessages(ctx, out); err != nil {
		return false, fmt.Errorf("publish %s/%d/%d to %s: %w", dlq, l.Partition, l.Offset, target, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("%w: %s/%d/%d was published to %s but its record did not commit (a second redrive publishes it again; "+
			"the consumer's keys absorb it): %v", errDatabase, dlq, l.Partition, l.Offset, target, err)
	}
	l.RedrivenAt = &ts
	return true, nil
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

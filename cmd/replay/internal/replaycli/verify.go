package replaycli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/keyview"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/exactly-go/exactly/kafkapubsub"
)

// VerifyConfig configures Verify.
type VerifyConfig struct {
	Copy        CopyConfig // the redelivery: the range of Topic copied into Topic
	DatabaseURL string
	Group       string
	// ChecksumSQL is the user's query over the consumer's state (balances,
	// say); its result must be the same before and after the replay.
	ChecksumSQL string
	// Scope, Schema and Table locate the consumer's dedupe keys. Without
	// Scope only the checksum is compared. Schema defaults to the
	// DatabaseURL's search_path, else "public", as pgstore's does. Without
	// Table the keys are read in either key layout (exactly_keys2 and its
	// names, and exactly_keys while it exists); Table names the key table
	// of a store with pgstore.LayoutSingleTable and a table of its own.
	Scope, Schema, Table string
	// KeyFunc and FingerprintFunc must be the consumer's (consumer.Config):
	// verify computes each replayed record's key and fingerprint with them
	// to find what the consumer stored. Default to consumer.KeyFromUUID and
	// dedupe.RawFingerprint, the middleware's defaults.
	KeyFunc         consumer.KeyFunc
	FingerprintFunc dedupe.FingerprintFunc
	// TTL is the consumer's key TTL: replayed records older than it may have
	// lost their keys and would apply twice. Defaults to dedupe.DefaultTTL.
	TTL time.Duration
	// Timeout bounds each wait for the group to catch up. Defaults to 5m.
	Timeout time.Duration
	// Warn receives warnings (records older than the TTL).
	Warn func(format string, args ...any)
}

// VerifyReport is what verify found. Pass is false on any double application.
type VerifyReport struct {
	Topic          string     `json:"topic"`
	Group          string     `json:"group"`
	Copy           CopyResult `json:"copy"`
	Replayed       int64      `json:"replayed"`
	Deduplicated   int64      `json:"deduplicated"`
	ReApplied      int64      `json:"re_applied"`
	KeyReused      int64      `json:"key_reused"`
	ExpiredKeys    int64      `json:"expired_keys"`
	Untracked      int64      `json:"untracked"`
	ChecksumBefore string     `json:"checksum_before"`
	ChecksumAfter  string     `json:"checksum_after"`
	RowsBefore     int64      `json:"rows_before"`
	RowsAfter      int64      `json:"rows_after"`
	StateChanged   bool       `json:"state_changed"`
	Pass           bool       `json:"pass"`
}

var (
	errDatabase = errors.New("database")
	errChecksum = errors.New("checksum query failed")
	errTimeout  = errors.New("the consumer group did not catch up in time")
)

// Verify proves that a consumer deduplicates a redelivery:
//
//  1. it waits until the consumer's group has consumed its topic to the end
//     (a group that lags would otherwise change the state during the replay);
//  2. it takes the "before" checksum of the state and notes the time;
//  3. it copies the range of the topic into the topic, streaming each
//     written record's key and fingerprint (computed as the consumer does)
//     into a temporary table, so memory stays bounded whatever the range;
//  4. it waits until the group has consumed the copies, takes the "after"
//     checksum, and classifies the copies against the consumer's keys in
//     one query.
//
// Any change of the checksum or any replayed key applied anew is a failure.
// The topic must be quiet meanwhile: records that others produce change the
// state as well.
func Verify(ctx context.Context, o VerifyConfig) (VerifyReport, error) {
	rep := VerifyReport{Topic: o.Copy.From, Group: o.Group}
	o.Copy.To, o.Copy.IntoSource = o.Copy.From, true
	if o.TTL == 0 {
		o.TTL = dedupe.DefaultTTL
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.KeyFunc == nil {
		o.KeyFunc = consumer.KeyFromUUID
	}
	if o.FingerprintFunc == nil {
		o.FingerprintFunc = dedupe.RawFingerprint
	}
	if o.ChecksumSQL == "" {
		return rep, fmt.Errorf("%w: --checksum-sql is required: a query over the state that must not change", errUsage)
	}
	if o.Group == "" {
		return rep, fmt.Errorf("%w: --group is required: the consumer group that consumes the topic", errUsage)
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
	}
	defer pool.Close()
	if o.Schema == "" {
		o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
	}
	k := newKafka(o.Copy.Brokers, o.Copy.Security)
	n, err := k.partitions(ctx, o.Copy.From)
	if err != nil {
		return rep, err
	}
	if state, _, err := k.groupState(ctx, o.Group); err != nil {
		return rep, err
	} else if state == "Dead" {
		return rep, fmt.Errorf("%w %q: it has never consumed", errUnknownGroup, o.Group)
	}
	// 1. The state is settled only once the group has caught up.
	if err := waitCaughtUp(ctx, k, o.Group, o.Copy.From, n, o.Timeout); err != nil {
		return rep, fmt.Errorf("before the replay: %w", err)
	}
	// 2.
	if rep.ChecksumBefore, rep.RowsBefore, err = checksum(ctx, pool, o.ChecksumSQL); err != nil {
		return rep, err
	}
	var start time.Time
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		return rep, fmt.Errorf("%w: %v", errDatabase, err)
	}

	// Records older than the TTL may have lost their keys: warn first.
	if rep.ExpiredKeys, err = olderThan(ctx, k, o.Copy.From, o.Copy.Range, time.Now().Add(-o.TTL)); err != nil {
		return rep, err
	}
	if rep.ExpiredKeys > 0 && o.Warn != nil {
		o.Warn("%d record(s) in the range are older than the key TTL (%v): their keys may have been cleaned up, so they may apply twice", rep.ExpiredKeys, o.TTL)
	}
	// 3.
	var tracked *keySink
	if o.Scope != "" {
		if tracked, err = newKeySink(ctx, pool, o); err != nil {
			return rep, err
		}
		defer tracked.close()
		o.Copy.each = tracked.add
	}
	rep.Copy, err = Copy(ctx, o.Copy)
	if tracked != nil {
		if ferr := tracked.finish(); err == nil {
			err = ferr
		}
	}
	if err != nil {
		return rep, err
	}
	rep.Replayed = rep.Copy.Written
	// 4.
	if err := waitCaughtUp(ctx, k, o.Group, o.Copy.From, n, o.Timeout); err != nil {
		return rep, err
	}
	if rep.ChecksumAfter, rep.RowsAfter, err = checksum(ctx, pool, o.ChecksumSQL); err != nil {
		return rep, err
	}
	rep.StateChanged = rep.ChecksumBefore != rep.ChecksumAfter
	if tracked != nil {
		if err := tracked.classify(ctx, start, &rep); err != nil {
			return rep, err
		}
	}
	rep.Pass = !rep.StateChanged && rep.ReApplied == 0
	return rep, nil
}

// keySink streams the key and fingerprint of each record the replay writes
// into a temporary table on a connection of its own (COPY FROM), through a
// bounded channel: the replay's memory does not grow with its length.
type keySink struct {
	o         VerifyConfig
	conn      *pgxpool.Conn
	rows      chan []any
	stop      context.CancelFunc
	ctx       context.Context
	done      chan error
	untracked atomic.Int64 // records without a valid key or fingerprint
	closeOnce sync.Once
}

func newKeySink(ctx context.Context, pool *pgxpool.Pool, o VerifyConfig) (*keySink, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errDatabase, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TEMP TABLE exactly_replayed (key text NOT NULL, fp text NOT NULL, n int NOT NULL)"); err != nil {
		conn.Release()
		return nil, fmt.Errorf("%w: create the temporary table of replayed keys: %v", errDatabase, err)
	}
	cctx, stop := context.WithCancel(ctx)
	s := &keySink{o: o, conn: conn, rows: make(chan []any, 4096), stop: stop, ctx: cctx, done: make(chan error, 1)}
	go func() {
		_, err := conn.Conn().CopyFrom(cctx, pgx.Identifier{"exactly_replayed"}, []string{"key", "fp", "n"},
			pgx.CopyFromFunc(func() ([]any, error) {
				select {
				case r, ok := <-s.rows:
					if !ok {
						return nil, nil
					}
					return r, nil
				case <-cctx.Done():
					return nil, cctx.Err()
				}
			}))
		if err != nil {
			stop() // unblock add
		}
		s.done <- err
	}()
	return s, nil
}

// add records one written record (times copies); it is called concurrently
// for different partitions.
func (s *keySink) add(m kafka.Message, copies int) error {
	msg := toMessage(m)
	id, err := s.o.KeyFunc(msg)
	if err != nil || id == "" || (dedupe.Key{Scope: s.o.Scope, ID: id}).Validate() != nil {
		s.untracked.Add(int64(copies)) // the consumer claims no key for it
		return nil
	}
	fp, err := s.o.FingerprintFunc(msg.Payload)
	if err != nil {
		s.untracked.Add(int64(copies)) // an invalid payload: dead-lettered, no key
		return nil
	}
	select {
	case s.rows <- []any{id, string(fp), copies}:
		return nil
	case <-s.ctx.Done():
		return fmt.Errorf("%w: stream the replayed keys: %v", errDatabase, s.ctx.Err())
	}
}

// finish ends the stream and waits for the COPY.
func (s *keySink) finish() error {
	s.closeOnce.Do(func() { close(s.rows) })
	if err := <-s.done; err != nil {
		return fmt.Errorf("%w: stream the replayed keys: %v", errDatabase, err)
	}
	return nil
}

func (s *keySink) close() {
	s.stop()
	s.conn.Release()
}

// classify sorts the replayed records by what the consumer's key says:
// deduplicated (a key older than the replay with the same fingerprint, or a
// later copy of a key the replay created), key reused (other fingerprint),
// re-applied (the replay created the key: its first copy applied again;
// counted once per key) or untracked (no key).
func (s *keySink) classify(ctx context.Context, start time.Time, rep *VerifyReport) error {
	var missing, reused, before, newKeys, newRecords int64
	for tries := 0; ; tries++ {
		keys, err := s.keys(ctx)
		if err != nil {
			return err
		}
		err = s.conn.QueryRow(ctx, `
SELECT coalesce(sum(r.n) FILTER (WHERE k.key IS NULL), 0),
       coalesce(sum(r.n) FILTER (WHERE k.fingerprint <> r.fp), 0),
       coalesce(sum(r.n) FILTER (WHERE k.fingerprint = r.fp AND k.created_at < $2), 0),
       count(DISTINCT r.key) FILTER (WHERE k.fingerprint = r.fp AND k.created_at >= $2),
       coalesce(sum(r.n) FILTER (WHERE k.fingerprint = r.fp AND k.created_at >= $2), 0)
  FROM pg_temp.exactly_replayed r LEFT JOIN (SELECT DISTINCT ON (key) key, fingerprint, created_at FROM `+keys+` WHERE scope = $1
                  ORDER BY key, created_at DESC) k ON k.key = r.key`,
			s.o.Scope, start).Scan(&missing, &reused, &before, &newKeys, &newRecords)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" && s.o.Table == "" && tries < 3 {
			// The single key table was retired (the partitioned layout's
			// clean-up drops it once its keys have all expired) between
			// finding the key tables and reading them: find them again.
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: read keys: %v", errDatabase, err)
		}
		break
	}
	rep.Untracked = s.untracked.Load() + missing
	rep.KeyReused = reused
	rep.ReApplied = newKeys
	rep.Deduplicated = before + newRecords - newKeys
	return nil
}

// keys returns the subquery of the consumer's keys: the table named, or
// the schema's key tables of either layout that exist (a key claimed again
// in the partitioned table after it expired in the single one is in both
// until the single table is dropped: classify reads its newest row).
func (s *keySink) keys(ctx context.Context) (string, error) {
	q := func(name string) string { return pgx.Identifier{s.o.Schema, name}.Sanitize() }
	if s.o.Table != "" {
		return keyview.SQL(keyview.Tables{Single: q(s.o.Table)}), nil
	}
	t, err := keyview.Existing(ctx, s.conn, keyview.Schema(q))
	if err != nil {
		return "", fmt.Errorf("%w: find the key tables: %v", errDatabase, err)
	}
	if t.Single == "" && t.Partitioned == "" {
		return "", fmt.Errorf("%w: schema %s has no key table (exactly_keys2 or exactly_keys): set --schema, or --table", errDatabase, s.o.Schema)
	}
	return keyview.SQL(t), nil
}

// toMessage is the Watermill message that the consumer's Subscriber makes
// of a record: UUID from its header, headers as metadata, the record key as
// kafka_key.
func toMessage(m kafka.Message) *message.Message {
	var uuid string
	md := make(message.Metadata, len(m.Headers)+1)
	for _, h := range m.Headers {
		if h.Key == kafkapubsub.UUIDHeader {
			uuid = string(h.Value)
			continue
		}
		md[h.Key] = string(h.Value)
	}
	if m.Key != nil {
		md[kafkapubsub.MetadataKafkaKey] = string(m.Key)
	}
	msg := message.NewMessage(uuid, m.Value)
	msg.Metadata = md
	return msg
}

// checksum runs the user's query and hashes its rows.
func checksum(ctx context.Context, pool *pgxpool.Pool, query string) (string, int64, error) {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %v", errChecksum, err)
	}
	defer rows.Close()
	h := sha256.New()
	var n int64
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "", 0, fmt.Errorf("%w: %v", errChecksum, err)
		}
		fmt.Fprintf(h, "%v\n", vals)
		n++
	}
	if err := rows.Err(); err != nil {
		return "", 0, fmt.Errorf("%w: %v", errChecksum, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// waitCaughtUp waits until group's committed offsets reach the topic's end.
func waitCaughtUp(ctx context.Context, k *kafkaClient, group, topic string, n int, d time.Duration) error {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	deadline := time.Now().Add(d)
	for {
		end, err := k.offsets(ctx, topic, parts, kafka.LastOffsetOf)
		if err != nil {
			return err
		}
		cur, err := k.committed(ctx, group, topic, n)
		if err != nil {
			return err
		}
		lag := int64(0)
		for p, e := range end {
			c := cur[p]
			if c < 0 {
				c = 0
			}
			lag += max(e-c, 0)
		}
		if lag == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s still %d behind on %s after %v (is the consumer running?)", errTimeout, group, lag, topic, d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Redact hides every password in a database URL or key=value connection
// string (and in text that quotes one), whether or not it parses: a bad
// port or sslmode must not print the password either. It reads only its
// argument, never PGPASSWORD.
func Redact(dsn string) string { return redact.Password(dsn) }

// olderThan counts the range's records written before cutoff.
func olderThan(ctx context.Context, k *kafkaClient, topic string, r Range, cutoff time.Time) (int64, error) {
	spans, err := k.resolve(ctx, topic, r)
	if err != nil {
		return 0, err
	}
	parts := make([]int, len(spans))
	for i, s := range spans {
		parts[i] = s.Partition
	}
	at, err := k.offsets(ctx, topic, parts, func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, cutoff) })
	if err != nil {
		return 0, err
	}
	var n int64
	for _, s := range spans {
		first := at[s.Partition] // first record at or after cutoff; -1: none
		if first < 0 {
			first = s.To
		}
		n += max(min(first, s.To)-s.From, 0)
	}
	return n, nil
}

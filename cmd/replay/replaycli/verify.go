package replaycli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/redact"
)

// VerifyOpts configures Verify.
type VerifyOpts struct {
	Copy        CopyOpts // the redelivery: the range of Topic copied into Topic
	DatabaseURL string
	Group       string
	// ChecksumSQL is the user's query over the consumer's state (balances,
	// say); its result must be the same before and after the replay.
	ChecksumSQL string
	// Scope, Schema and Table locate the consumer's dedupe keys. Without
	// Scope only the checksum is compared.
	Scope, Schema, Table string
	// TTL is the consumer's key TTL: replayed records older than it may have
	// lost their keys and would apply twice. Defaults to dedupe.DefaultTTL.
	TTL time.Duration
	// Timeout bounds the wait for the group to catch up. Defaults to 5m.
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

// Verify snapshots the consumer's state (the checksum query and its dedupe
// keys), redelivers a range of its topic into the same topic, waits until
// its group has consumed everything, snapshots again, and reports. Any
// change of the checksum or any replayed key applied anew is a failure.
func Verify(ctx context.Context, o VerifyOpts) (VerifyReport, error) {
	rep := VerifyReport{Topic: o.Copy.From, Group: o.Group}
	o.Copy.To, o.Copy.IntoSource = o.Copy.From, true
	if o.TTL == 0 {
		o.TTL = dedupe.DefaultTTL
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Schema == "" {
		o.Schema = "public"
	}
	if o.Table == "" {
		o.Table = "exactly_keys"
	}
	if o.ChecksumSQL == "" {
		return rep, errors.New("--checksum-sql is required: a query over the state that must not change")
	}
	if o.Group == "" {
		return rep, errors.New("--group is required: the consumer group that consumes the topic")
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
	}
	defer pool.Close()
	k := newKafka(o.Copy.Brokers)
	n, err := k.partitions(ctx, o.Copy.From)
	if err != nil {
		return rep, err
	}
	if state, _, err := k.groupState(ctx, o.Group); err != nil {
		return rep, err
	} else if state == "Dead" {
		return rep, fmt.Errorf("%w %q: it has never consumed", errUnknownGroup, o.Group)
	}
	if rep.ChecksumBefore, rep.RowsBefore, err = checksum(ctx, pool, o.ChecksumSQL); err != nil {
		return rep, err
	}
	var start time.Time
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		return rep, fmt.Errorf("%w: %v", errDatabase, err)
	}
	if err := waitCaughtUp(ctx, k, o.Group, o.Copy.From, n, o.Timeout); err != nil {
		return rep, fmt.Errorf("before the replay: %w", err)
	}

	// Records older than the TTL may have lost their keys: warn first.
	if rep.ExpiredKeys, err = olderThan(ctx, k, o.Copy.From, o.Copy.Range, time.Now().Add(-o.TTL)); err != nil {
		return rep, err
	}
	if rep.ExpiredKeys > 0 && o.Warn != nil {
		o.Warn("%d record(s) in the range are older than the key TTL (%v): their keys may have been cleaned up, so they may apply twice", rep.ExpiredKeys, o.TTL)
	}
	var replayed []written
	var mu sync.Mutex
	o.Copy.each = func(m kafka.Message, payload []byte) {
		mu.Lock()
		defer mu.Unlock()
		w := written{fp: dedupe.FingerprintOf(payload)}
		for _, h := range m.Headers {
			if h.Key == consumer.UUIDHeader {
				w.id = string(h.Value)
			}
		}
		for range max(o.Copy.Duplicate, 1) {
			replayed = append(replayed, w)
		}
	}
	rep.Copy, err = Copy(ctx, o.Copy)
	if err != nil {
		return rep, err
	}
	rep.Replayed = rep.Copy.Written
	if err := waitCaughtUp(ctx, k, o.Group, o.Copy.From, n, o.Timeout); err != nil {
		return rep, err
	}
	if rep.ChecksumAfter, rep.RowsAfter, err = checksum(ctx, pool, o.ChecksumSQL); err != nil {
		return rep, err
	}
	rep.StateChanged = rep.ChecksumBefore != rep.ChecksumAfter
	if o.Scope != "" {
		if err := classify(ctx, pool, o, replayed, start, &rep); err != nil {
			return rep, err
		}
	}
	rep.Pass = !rep.StateChanged && rep.ReApplied == 0
	return rep, nil
}

// written is one record the replay wrote: its UUID and payload fingerprint.
type written struct {
	id string
	fp dedupe.Fingerprint
}

// classify sorts each replayed record by what its key says: deduplicated
// (key older than the replay, same fingerprint), key reused (other
// fingerprint), re-applied (the key was created by the replay: its first
// copy applied again) or untracked (no key).
func classify(ctx context.Context, pool *pgxpool.Pool, o VerifyOpts, replayed []written, start time.Time, rep *VerifyReport) error {
	ids := make([]string, 0, len(replayed))
	for _, w := range replayed {
		ids = append(ids, w.id)
	}
	type key struct {
		fp      dedupe.Fingerprint
		created time.Time
	}
	keys := map[string]key{}
	table := pgx.Identifier{o.Schema, o.Table}.Sanitize()
	rows, err := pool.Query(ctx, "SELECT key, fingerprint, created_at FROM "+table+" WHERE scope = $1 AND key = ANY($2)", o.Scope, ids)
	if err != nil {
		return fmt.Errorf("%w: read keys: %v", errDatabase, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, fp string
		var created time.Time
		if err := rows.Scan(&id, &fp, &created); err != nil {
			return fmt.Errorf("%w: read keys: %v", errDatabase, err)
		}
		keys[id] = key{dedupe.Fingerprint(fp), created}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: read keys: %v", errDatabase, err)
	}
	counted := map[string]bool{}
	for _, w := range replayed {
		k, ok := keys[w.id]
		switch {
		case !ok || w.id == "":
			rep.Untracked++
		case k.fp != w.fp:
			rep.KeyReused++
		case !k.created.Before(start) && !counted[w.id]:
			rep.ReApplied++
			counted[w.id] = true
		default:
			rep.Deduplicated++
		}
	}
	return nil
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

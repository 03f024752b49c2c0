package chaos

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// By default the workers keep their keys in the partitioned layout
// (pgstore.LayoutPartitioned, the default): half the workload's IDs are
// UUIDv7s, which go to the time partitions of their mint time, and half are
// UUIDv4s, which go to exactly_keys2_other. At the end the audit reads the
// keys from the layout's tables, and keyStats.check proves that both kinds
// of partition hold keys and the single table none. With
// CHAOS_KEY_MAINTENANCE=1 partition maintenance runs all the time too: time
// partitions keyWidth wide, the key clean-up (which creates them ahead)
// every keyCleanup, so that copies and redeliveries meet partitions being
// created, attached and dropped under them, and keyStats.check proves that
// the maintenance ran. CHAOS_KEY_LAYOUT=single-table runs the workers on
// the single table (pgstore.LayoutSingleTable) instead.
const (
	keyWidth   = 2 * time.Second
	keyCleanup = time.Second
	// minTimeParts is the fewest time partitions a run must end with: the
	// short run lasts well over a minute, a partition every keyWidth.
	minTimeParts = 20
)

// narrowPartitions sets the time partitions' width in the workers' schema;
// it must run before the first partition is created (by a worker's start).
func narrowPartitions(ctx context.Context, pool *pgxpool.Pool) error {
	// `ledger migrate` created the first day-wide partitions, empty (no
	// worker has claimed yet): they go, and the workers create narrow ones.
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ledger.exactly_keys2'::regclass AND c.relname ~ '^exactly_keys2_p[0-9]+$'`)
	if err != nil {
		return fmt.Errorf("chaos: list the key partitions: %w", err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("chaos: list the key partitions: %w", err)
	}
	for _, part := range parts {
		if _, err := pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{"ledger", part}.Sanitize()); err != nil {
			return fmt.Errorf("chaos: drop the day partition %s: %w", part, err)
		}
	}
	tag, err := pool.Exec(ctx, `UPDATE ledger.exactly_keys2_state SET width = make_interval(secs => $1), low = NULL WHERE started_at IS NULL`, keyWidth.Seconds())
	if err != nil {
		return fmt.Errorf("chaos: set the key partitions' width: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return errors.New("chaos: set the key partitions' width: the layout's state row is missing or the layout has started")
	}
	return nil
}

// waitPartitions waits until a worker created the first time partitions
// and returns the start of the first.
func waitPartitions(ctx context.Context, pool *pgxpool.Pool, d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for {
		var low *time.Time
		err := pool.QueryRow(ctx, `SELECT low FROM ledger.exactly_keys2_state`).Scan(&low)
		if err == nil && low != nil {
			return *low, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("chaos: no worker created the key partitions within %v (last error: %v)", d, err)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(100 * time.Millisecond): // polling the state row
		}
	}
}

// waitConsuming waits until the group is stable with every worker in it
// and the commands topic assigned, then for the start of the next time
// partition: the UUIDv7s minted right after then land in a partition that
// gets its first keys well before its range is past. (A time partition
// still empty once its range is past is retired at once, and the IDs of its
// range go to exactly_keys2_other from then on, as kind 'o'.)
func waitConsuming(ctx context.Context, brokers []string, workers int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		g, err := describeGroup(ctx, brokers)
		if err == nil && g.stable && g.members == workers && g.assigned == partitions {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the group did not take the commands topic within %v", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling the group
		}
	}
	for start := time.Now().Truncate(keyWidth); time.Now().Truncate(keyWidth).Equal(start); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // polling the clock
		}
	}
	return nil
}

// waitMembers waits until the workers' group is stable with every worker
// a member, then checks that they are franz-go's cooperative-sticky
// members, each static when static is set.
func waitMembers(ctx context.Context, brokers []string, workers int, static bool, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		g, err := describeGroup(ctx, brokers)
		if err == nil && g.stable && g.members == workers {
			if g.protocol != "cooperative-sticky" {
				return fmt.Errorf("chaos: the workers' group assigns with %q, want franz-go's cooperative-sticky", g.protocol)
			}
			if static && g.static != workers {
				return fmt.Errorf("chaos: %d of the group's %d members are static, want all", g.static, workers)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the group did not have its %d workers within %v (%+v, %v)", workers, d, g, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling the group
		}
	}
}

// readKeys2 reads the keys of the partitioned layout into st: each row's
// ID written back from its kid and kind, as pgstore stores it.
func readKeys2(ctx context.Context, pool *pgxpool.Pool, st *dbState) error {
	rows, err := pool.Query(ctx, `SELECT n.name, k.kid::text, k.kind::text, k.id_text, encode(k.fingerprint, 'hex'), k.status::text
FROM ledger.exactly_keys2 k JOIN ledger.exactly_key_names n ON n.code = k.scope`)
	if err != nil {
		return err
	}
	defer rows.Close()
	perScope := map[[2]string]int{}
	for rows.Next() {
		var scope, kid, kind, fp, status string
		var text *string
		if err := rows.Scan(&scope, &kid, &kind, &text, &fp, &status); err != nil {
			return err
		}
		id, err := storedID(kid, kind, text)
		if err != nil {
			return err
		}
		perScope[[2]string{scope, id}]++
		if status == "P" {
			st.processing++
		}
		if scope == "ledger-consumer" {
			st.keys[id] = fp
			st.keyKinds[id] = kind
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, n := range perScope {
		if n > 1 {
			st.doubleKeys++
		}
	}
	return nil
}

// storedID is the ID of a row of exactly_keys2 (see migration 00007).
func storedID(kid, kind string, text *string) (string, error) {
	if kind == "t" {
		if text == nil {
			return "", fmt.Errorf("chaos: key %s of kind t has no id_text", kid)
		}
		return *text, nil
	}
	b, err := hex.DecodeString(strings.ReplaceAll(kid, "-", ""))
	if err != nil || len(b) != 16 {
		return "", fmt.Errorf("chaos: key %s: not a UUID", kid)
	}
	switch kind {
	case "7": // a UUIDv7 in its time partition, as is
	case "o": // a UUIDv7 older than the time partitions
		b[0] &^= 0xe0
	case "u": // another UUID, bytes 0 and 6 swapped
		b[0], b[6] = b[6], b[0]
	default:
		return "", fmt.Errorf("chaos: key %s of kind %q, which the workload does not make", kid, kind)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// keyStats is the partitioned layout's state at the end of a run.
type keyStats struct {
	width           time.Duration
	timeParts       int // time partitions attached to exactly_keys2
	partsWithKeys   int // of them, the ones holding keys
	inTime, inOther int // keys in time partitions, in exactly_keys2_other
	byKind          map[string]int
	legacy          int // keys in exactly_keys (if not dropped), which the workers must not use
	// copies counts the IDs on more than one committed record, by UUID
	// version ('7', '4'); repeated by the kind of their key row.
	copies   map[byte]int
	repeated map[string]int
	// retired counts the time partitions retired since the first one (by
	// the state's low bound); created those retired and those attached.
	retired, created    int
	firstPart, lastPart string
}

// readKeyStats reads the layout's state at the end of a run whose first
// time partition started at firstLow; committed and db are the audit's.
func readKeyStats(ctx context.Context, pool *pgxpool.Pool, firstLow time.Time, committed []rec, db *dbState) (*keyStats, error) {
	ks := &keyStats{byKind: map[string]int{}, copies: map[byte]int{}, repeated: map[string]int{}}
	n := map[string]int{}
	for _, r := range committed {
		if n[r.uuid]++; n[r.uuid] == 2 && len(r.uuid) == 36 {
			ks.copies[r.uuid[14]]++
			if k, ok := db.keyKinds[r.uuid]; ok {
				ks.repeated[k]++
			}
		}
	}
	var low *time.Time // NULL: no partition was ever created
	if err := pool.QueryRow(ctx, `SELECT low FROM ledger.exactly_keys2_state`).Scan(&low); err != nil {
		return nil, err
	}
	var ms int64
	if err := pool.QueryRow(ctx, `SELECT (extract(epoch FROM width) * 1000)::bigint FROM ledger.exactly_keys2_state`).Scan(&ms); err != nil {
		return nil, err
	}
	ks.width = time.Duration(ms) * time.Millisecond
	if ks.width > 0 && low != nil && !firstLow.IsZero() {
		ks.retired = int(low.Sub(firstLow) / ks.width)
	}
	err := pool.QueryRow(ctx, `SELECT count(*), coalesce(min(c.relname), ''), coalesce(max(c.relname), '')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ledger.exactly_keys2'::regclass AND c.relname <> 'exactly_keys2_other'`).Scan(&ks.timeParts, &ks.firstPart, &ks.lastPart)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT k.tableoid = 'ledger.exactly_keys2_other'::regclass, k.kind::text, count(*), count(DISTINCT k.tableoid)
FROM ledger.exactly_keys2 k GROUP BY 1, 2`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var other bool
		var kind string
		var n, parts int
		if err := rows.Scan(&other, &kind, &n, &parts); err != nil {
			return nil, err
		}
		ks.byKind[kind] += n
		if other {
			ks.inOther += n
		} else {
			ks.inTime += n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM ledger.exactly_keys2 WHERE tableoid <> 'ledger.exactly_keys2_other'::regclass`).Scan(&ks.partsWithKeys); err != nil {
		return nil, err
	}
	// The clean-up drops the single table once the layout started and
	// none of its keys is live: on a new deployment, at once.
	var single bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('ledger.exactly_keys') IS NOT NULL`).Scan(&single); err != nil {
		return nil, err
	}
	if single {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger.exactly_keys`).Scan(&ks.legacy); err != nil {
			return nil, err
		}
	}
	ks.created = ks.timeParts + ks.retired
	return ks, nil
}

// check reports, as problems of f, a run in which the maintenance did not
// run or did not bite.
func (ks *keyStats) check(f *findings, maintenance bool) {
	if maintenance {
		ks.checkMaintenance(f)
	}
	if ks.inTime == 0 {
		f.fail("partitions", "no key in a time partition")
	}
	if ks.inOther == 0 {
		f.fail("partitions", "no key in exactly_keys2_other")
	}
	if ks.copies['7'] == 0 || ks.copies['4'] == 0 {
		f.fail("partitions", "IDs on more than one record: %d UUIDv7s, %d UUIDv4s; want some of each", ks.copies['7'], ks.copies['4'])
	}
	if ks.legacy > 0 {
		f.fail("partitions", "%d keys in the single table exactly_keys", ks.legacy)
	}
}

// checkMaintenance: with the maintenance forced, the partitions are
// keyWidth wide and the clean-up kept creating them.
func (ks *keyStats) checkMaintenance(f *findings) {
	if ks.width != keyWidth {
		f.fail("partitions", "the time partitions are %v wide, want %v", ks.width, keyWidth)
	}
	if ks.timeParts < minTimeParts {
		f.fail("partitions", "%d time partitions of exactly_keys2, want %d or more: the maintenance did not keep creating them", ks.timeParts, minTimeParts)
	}
}

func (ks *keyStats) String() string {
	return fmt.Sprintf("width=%v time-partitions created=%d retired=%d attached=%d (%s … %s, %d holding keys) keys in-time-partitions=%d in-other=%d by-kind=%v legacy=%d; repeated ids=%d UUIDv7, %d UUIDv4, by key kind %v",
		ks.width, ks.created, ks.retired, ks.timeParts, ks.firstPart, ks.lastPart, ks.partsWithKeys, ks.inTime, ks.inOther, ks.byKind, ks.legacy,
		ks.copies['7'], ks.copies['4'], ks.repeated)
}

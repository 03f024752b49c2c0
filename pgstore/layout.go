package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// Layout is how a Store keeps its keys.
type Layout int

const (
	// LayoutPartitioned, the default, keeps keys compact (the ID as 16
	// bytes when it is a UUID or a ULID, a 32-byte fingerprint, small codes
	// for scope, topic and status) in a table range-partitioned on the ID
	// (exactly_keys2, migration 00007). Keys with time-ordered IDs (UUIDv7,
	// ULID) go to the time partition of their mint time, which Cleanup
	// creates ahead and drops whole once every key in it is past its TTL;
	// any other ID goes to one partition retired by DELETE. A deployment's
	// single table (exactly_keys) serves as its oldest generation until its
	// keys expire: claims look there first, and nothing is copied. See
	// docs/keys.md.
	LayoutPartitioned Layout = iota
	// LayoutSingleTable keeps every key in one table (exactly_keys,
	// migration 00001): text columns, retired by DELETE and VACUUM. For a
	// deployment that has not switched yet (docs/upgrading.md); once a store
	// of the partitioned layout ran on the schema, a store of this one is
	// refused ([ErrLegacyClosed]).
	LayoutSingleTable
)

// LayoutLegacy is LayoutSingleTable.
//
// Deprecated: use LayoutSingleTable.
const LayoutLegacy = LayoutSingleTable

func (l Layout) String() string {
	switch l {
	case LayoutSingleTable:
		return "single-table"
	case LayoutPartitioned:
		return "partitioned"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// The kinds of a stored ID (exactly_keys2.kind).
const (
	kindUUIDv7    = '7' // a UUIDv7, in its time partition
	kindULID      = 'l' // a ULID, in its time partition
	kindOldUUIDv7 = 'o' // a UUIDv7 older than the time partitions, first byte | 0xe0
	kindOldULID   = 'p' // a ULID older than the time partitions, first byte | 0xe0
	kindUUID      = 'u' // any other UUID, bytes 0 and 6 swapped
	kindText      = 't' // anything else: 0xff and 15 bytes of its SHA-256, the ID in id_text
)

// storedID is an ID as the partitioned layout stores it.
type storedID struct {
	kid  [16]byte
	kind byte
	// text is the ID itself, stored for kindText only.
	text *string
	// minted is a time-ordered ID's time, which picks its partition.
	minted time.Time
	timed  bool
}

// encodeID encodes id for the partitioned layout; low is the start of the
// oldest time partition (zero: none yet).
func encodeID(id string, low time.Time) storedID {
	if t, err := dedupe.ParseTimeID(id); err == nil && t.String() == id && t.Bytes[0] < 0x10 {
		s := storedID{kid: t.Bytes, kind: kindUUIDv7, minted: t.Time(), timed: true}
		if t.Kind == dedupe.ULID {
			s.kind = kindULID
		}
		if low.IsZero() || s.minted.Before(low) {
			s.kid[0] |= 0xe0
			s.kind, s.timed = map[byte]byte{kindUUIDv7: kindOldUUIDv7, kindULID: kindOldULID}[s.kind], false
		}
		return s
	}
	if u, ok := parseUUID(id); ok && u[6]>>4 != 0 {
		u[0], u[6] = u[6], u[0]
		return storedID{kid: u, kind: kindUUID}
	}
	sum := sha256.Sum256([]byte(id))
	s := storedID{kind: kindText, text: &id}
	s.kid[0] = 0xff
	copy(s.kid[1:], sum[:15])
	return s
}

// parseUUID parses a UUID in canonical form (lowercase, hyphenated): only
// that form is stored as 16 bytes, so that the ID is written back exactly.
func parseUUID(id string) ([16]byte, bool) {
	var u [16]byte
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' || strings.ToLower(id) != id {
		return u, false
	}
	digits := id[0:8] + id[9:13] + id[14:18] + id[19:23] + id[24:36]
	if _, err := hex.Decode(u[:], []byte(digits)); err != nil {
		return u, false
	}
	return u, true
}

// timeBound is the smallest kid of a time-ordered ID minted at t.
func timeBound(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// partitioned is a Store's state for LayoutPartitioned.
type partitioned struct {
	schema, table string // unquoted
	parent        string // the partitioned table, schema-qualified and quoted
	other         string // its partition for keys that are not time-ordered
	names, state  string // the code and state tables
	// batchClaim and batchLock are the batch statements (p2BatchClaimSQL,
	// p2BatchLockSQL) on the partitioned table.
	batchClaim, batchLock string

	// now is the store's clock. Defaults to time.Now.
	now func() time.Time

	codes sync.Map // name → int16, committed codes only

	mu     sync.Mutex
	st     layoutState
	readAt time.Time
	// qs are the statements by the table they target (a partition, or ""
	// for the parent) and the legacy table they probe ("" for none).
	qs map[[2]string]*queries
}

// layoutState is the state row, as last read.
type layoutState struct {
	width time.Duration
	// low is the start of the oldest time partition; zero before the first
	// maintenance run.
	low time.Time
	// legacy is the schema-qualified, quoted table probed as the oldest
	// generation, and its name; "" once it is retired.
	legacy, legacyName string
	// otherDirect: the store's role may read, insert and update the
	// partition for keys that are not time-ordered by its own name.
	otherDirect bool
	// high is the end of the newest time partition (zero: none).
	high time.Time
	// dbNow is the database's clock when the state was read, and readAt
	// the store's (p.now); the database's clock later is dbNow plus the
	// time elapsed on the store's, whatever its offset.
	dbNow, readAt time.Time
}

// dbClock is the database's clock now, as the state last read tells it.
func (st layoutState) dbClock(now time.Time) time.Time { return st.dbNow.Add(now.Sub(st.readAt)) }

// stateTTL is how long a Store trusts the state it read. Maintenance keeps
// a retired legacy table readable for longer than this.
const stateTTL = 10 * time.Second

func newPartitioned(schema, table string) *partitioned {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	p := &partitioned{schema: schema, table: table, parent: q(table), other: q(table + "_other"),
		names: q("exactly_key_names"), state: q(table + "_state"), qs: map[[2]string]*queries{}, now: time.Now}
	r := strings.NewReplacer("{P}", p.parent, "{N}", p.names)
	p.batchClaim, p.batchLock = r.Replace(p2BatchClaimSQL), r.Replace(p2BatchLockSQL)
	return p
}

// layoutState returns the state, read again when stale. The lock is never
// held across the query: a claim holding a connection may need it.
func (p *partitioned) layoutState(ctx context.Context, db DBTX) (layoutState, error) {
	p.mu.Lock()
	st, fresh := p.st, !p.readAt.IsZero() && time.Since(p.readAt) < stateTTL
	p.mu.Unlock()
	if fresh {
		return st, nil
	}
	var (
		width  time.Duration
		low    *time.Time
		legacy *string
		direct bool
		newest *int64
		dbNow  time.Time
	)
	var started bool
	if err := db.QueryRow(ctx, `SELECT width, low, legacy, started_at IS NOT NULL, has_table_privilege($1::regclass, 'SELECT')
       AND has_table_privilege($1::regclass, 'INSERT') AND has_table_privilege($1::regclass, 'UPDATE'),
       (SELECT max(substr(c.relname, length($3) + 3)::int8) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = $2::regclass AND left(c.relname, length($3) + 2) = $3 || '_p'
          AND substr(c.relname, length($3) + 3) ~ '^[0-9]+$'),
       clock_timestamp() FROM `+p.state, p.other, p.parent, p.table).
		Scan(&width, &low, &legacy, &started, &direct, &newest, &dbNow); err != nil {
		return layoutState{}, classify("read "+p.state, err)
	}
	if !started {
		// The first claim of the layout on this schema starts it, in a
		// transaction of its own: from then on no store of the legacy
		// layout inserts a key (see migration 00008). Never in a caller's
		// transaction: one whose snapshot predates a legacy claim would
		// not see its key, and one that rolls back would undo the start.
		if _, pooled := db.(*pgxpool.Pool); !pooled {
			return layoutState{}, fmt.Errorf("pgstore: %w: the partitioned key layout has not started on schema %s: "+
				"call Store.Check at start-up (a worker does), before claiming in a transaction of your own",
				dedupe.ErrMisconfigured, p.schema)
		}
		if _, err := db.Exec(ctx, "SELECT "+pgx.Identifier{p.schema, "exactly_keys2_start"}.Sanitize()+"()"); err != nil {
			return layoutState{}, classify("start the partitioned layout", err)
		}
	}
	st = layoutState{width: width, otherDirect: direct, dbNow: dbNow, readAt: p.now()}
	if newest != nil {
		st.high = time.Unix(*newest, 0).Add(width)
	}
	if low != nil {
		st.low = *low
	}
	if legacy != nil {
		st.legacy = pgx.Identifier{p.schema, *legacy}.Sanitize()
		st.legacyName = *legacy
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st, p.readAt = st, time.Now()
	return st, nil
}

// stale reports whether the next layoutState reads the state.
func (p *partitioned) stale() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readAt.IsZero() || time.Since(p.readAt) >= stateTTL
}

// forget makes the next layoutState read the state again.
func (p *partitioned) forget() {
	p.mu.Lock()
	p.readAt = time.Time{}
	p.mu.Unlock()
}

// queriesFor returns the statements on target (a partition; "" for the
// parent table) for st.
func (p *partitioned) queriesFor(st layoutState, target string) *queries {
	k := [2]string{target, st.legacy}
	p.mu.Lock()
	defer p.mu.Unlock()
	if q, ok := p.qs[k]; ok {
		return q
	}
	t := p.parent
	if target != "" {
		t = p.quoted(target)
	}
	q := newPartitionedQueries(t, p.names, st.legacy)
	p.qs[k] = &q
	return &q
}

// target returns the table that a claim of sid names: the partition for
// keys that are not time-ordered, by its own name, when the store's role
// may use it (its grants are its own: a role granted the partitioned table
// only may not); else "", the partitioned table, which routes the key. A
// statement on the partition is planned once per connection, as on the
// legacy layout; on the partitioned table it is planned again at each
// execution, to prune the other partitions. Time partitions are always
// reached through the partitioned table: one is detached when it is
// retired, and a claim that named it and waited for the detach would then
// insert into a table that is no longer a partition, and is dropped.
func (p *partitioned) target(st layoutState, sid storedID) string {
	if sid.timed || !st.otherDirect {
		return ""
	}
	return p.table + "_other"
}

// code returns name's code in the names table, adding it when missing,
// on db: a code is cached only once it is committed, so every Store of the
// table agrees on it. On the pool the name is added in a statement of its
// own (autocommit); Do and DoBatch resolve their codes so, before they
// open their transaction. On a caller's transaction (ClaimTx,
// ClaimBatchTx) it is added in that transaction, which holds the store's
// only connection when the pool has one: it is used there, and cached only
// when read by a transaction that holds no transaction ID yet (which cannot
// have added it) or by Do and DoBatch.
func (p *partitioned) code(ctx context.Context, db DBTX, name string) (int16, error) {
	if c, ok := p.codes.Load(name); ok {
		return c.(int16), nil
	}
	if _, ok := db.(*pgxpool.Pool); !ok {
		return p.codeTx(ctx, db, name)
	}
	pool := db
	var c int16
	err := pool.QueryRow(ctx, `WITH ins AS (INSERT INTO `+p.names+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING code)
SELECT code FROM ins UNION ALL SELECT code FROM `+p.names+` WHERE name = $1 LIMIT 1`, name).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) {
		// Added by a transaction that committed while the insert waited.
		err = pool.QueryRow(ctx, "SELECT code FROM "+p.names+" WHERE name = $1", name).Scan(&c)
	}
	if err != nil {
		return 0, classify(fmt.Sprintf("code of %q", name), err)
	}
	p.codes.Store(name, c)
	return c, nil
}

// codeTx is code in a caller's transaction tx.
func (p *partitioned) codeTx(ctx context.Context, tx DBTX, name string) (int16, error) {
	var (
		c    int16
		xact *string
	)
	op := fmt.Sprintf("code of %q", name)
	err := tx.QueryRow(ctx, "SELECT code, pg_current_xact_id_if_assigned()::text FROM "+p.names+" WHERE name = $1", name).Scan(&c, &xact)
	if err == nil {
		// Visible here, the row is committed unless this transaction (or
		// one of its savepoints, through this Store or any other of the
		// schema) added it, which it can have done only once it holds a
		// transaction ID: cached only when it holds none.
		if xact == nil {
			p.codes.Store(name, c)
		}
		return c, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, classify(op, err)
	}
	err = tx.QueryRow(ctx, `INSERT INTO `+p.names+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
RETURNING code`, name).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) {
		// Added by a transaction that committed while the insert waited.
		if err = tx.QueryRow(ctx, "SELECT code FROM "+p.names+" WHERE name = $1", name).Scan(&c); err == nil {
			p.codes.Store(name, c)
			return c, nil
		}
	}
	if err != nil {
		return 0, classify(op, err)
	}
	return c, nil
}

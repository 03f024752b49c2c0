package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// partitioned is LayoutPartitioned, and its state.
type partitioned struct {
	s             *Store
	schema, table string // unquoted
	parent        string // the partitioned table, schema-qualified and quoted
	other         string // its partition for keys that are not time-ordered
	names, state  string // the code and state tables
	// batchInsert, batchClaim and batchLock are the batch statements
	// (p2BatchInsertSQL, p2BatchClaimSQL, p2BatchLockSQL) on the
	// partitioned table.
	batchInsert, batchClaim, batchLock string
	// cleanupSQL deletes expired keys from the partition of keys that are
	// not time-ordered (p2CleanupSQL).
	cleanupSQL string

	// now is the store's clock. Defaults to time.Now.
	now func() time.Time

	codes sync.Map // name → int16, committed codes only

	mu     sync.Mutex
	st     layoutState
	readAt time.Time
	// retiredSeen is when this store's maintenance first saw the single
	// table retired and still there; dropAfter later it drops it.
	retiredSeen time.Time
	dropAfter   time.Duration
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
	// direct names the time partitions attached when the state was read
	// that the store's role may read, insert and update by their own names
	// (see target).
	direct map[string]bool
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
// a retired legacy table readable for longer than this (dropAfter).
const stateTTL = 10 * time.Second

func newPartitioned(s *Store, schema, table string) *partitioned {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	p := &partitioned{s: s, schema: schema, table: table, parent: q(table), other: q(table + "_other"),
		names: q("exactly_key_names"), state: q(table + "_state"), qs: map[[2]string]*queries{}, now: time.Now,
		dropAfter: 2 * stateTTL}
	r := strings.NewReplacer("{P}", p.parent, "{N}", p.names)
	p.batchInsert, p.batchClaim, p.batchLock = r.Replace(p2BatchInsertSQL), r.Replace(p2BatchClaimSQL), r.Replace(p2BatchLockSQL)
	p.cleanupSQL = strings.ReplaceAll(p2CleanupSQL, "{P}", p.other)
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
		parts  []string
	)
	var started bool
	if err := db.QueryRow(ctx, `SELECT width, low, legacy, started_at IS NOT NULL, has_table_privilege($1::regclass, 'SELECT')
       AND has_table_privilege($1::regclass, 'INSERT') AND has_table_privilege($1::regclass, 'UPDATE'),
       (SELECT max(substr(c.relname, length($3) + 3)::int8) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = $2::regclass AND left(c.relname, length($3) + 2) = $3 || '_p'
          AND substr(c.relname, length($3) + 3) ~ '^[0-9]+$'),
       clock_timestamp(),
       ARRAY(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = $2::regclass AND left(c.relname, length($3) + 2) = $3 || '_p'
               AND has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT')
               AND has_table_privilege(c.oid, 'UPDATE'))
FROM `+p.state, p.other, p.parent, p.table).
		Scan(&width, &low, &legacy, &started, &direct, &newest, &dbNow, &parts); err != nil {
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
	st = layoutState{width: width, otherDirect: direct, dbNow: dbNow, readAt: p.now(), direct: make(map[string]bool, len(parts))}
	for _, n := range parts {
		st.direct[n] = true
	}
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
	t, guard := p.parent, ""
	if target != "" {
		t = p.quoted(target)
		if target != p.table+"_other" {
			guard = p.attachedGuard(target)
		}
	}
	q := newPartitionedQueries(t, p.names, st.legacy, guard)
	if len(p.qs) >= maxCachedQueries {
		// The statements of retired partitions would pile up (one set a
		// partition, 10–15 KB): start again, and make those still in use
		// again as they are asked for.
		clear(p.qs)
	}
	p.qs[k] = &q
	return &q
}

// maxCachedQueries bounds the sets of statements a partitioned layout
// keeps (queriesFor): a set for each partition a claim names, a year of
// daily partitions and more.
const maxCachedQueries = 512

// target returns the table that a statement on the key sid names: its
// partition, by its own name, when the store's role may use it (its grants
// are its own: a role granted the partitioned table only may not) and, for
// a time partition, when st saw it attached; else "", the partitioned
// table, which routes the key. A statement on a partition is planned once
// per connection, as on the single-table layout; on the partitioned table
// it is planned again at each execution, to prune the other partitions,
// which halves the claim rate.
//
// A time partition is detached when it is retired, then dropped: a claim
// that names it and waits for the retirement's lock would then insert into
// a table that is no longer a partition, its key lost with the table and
// claimed again as new. Every statement on a time partition is guarded
// against that (attachedGuard): it fails, and the claim is retried with
// the state read again, unless the partition is still attached once the
// statement holds its lock.
func (p *partitioned) target(st layoutState, sid storedID) string {
	if !sid.timed {
		if st.otherDirect {
			return p.table + "_other"
		}
		return ""
	}
	if st.width <= 0 || st.low.IsZero() || sid.minted.Before(st.low) {
		return ""
	}
	name := p.partName(st.low.Add(sid.minted.Sub(st.low) / st.width * st.width))
	if !st.direct[name] {
		return ""
	}
	return name
}

// attachedGuard is the condition (followed by AND) that guards a statement
// on the time partition named part (see target): true while part is a
// partition of the partitioned table, else an error, 42P01 (a relation
// that does not exist), which layoutChanged reads as the layout changed
// under the statement. pg_partition_root reads the catalog as it is
// (not the statement's snapshot, whatever the isolation level), and the
// planner folds it to a constant: it runs when the statement is planned,
// once the statement holds its locks, which wait for the retirement's
// transaction; a retirement's DETACH or DROP invalidates the plans that
// name the partition, so a plan cached before is planned again. The
// statement is planned once while the partition stays attached.
func (p *partitioned) attachedGuard(part string) string {
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	gone := `"pgstore: ` + part + ` is no longer a partition of ` + p.table + `: the layout's state is read again"`
	return "(CASE WHEN pg_catalog.pg_partition_root(" + lit(p.quoted(part)) + "::regclass) = " + lit(p.parent) +
		"::regclass THEN true ELSE " + lit(gone) + "::text::regclass IS NULL END) AND "
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

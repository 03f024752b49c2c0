package pgstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/backoff"
)

// Partition maintenance for LayoutPartitioned, run by Cleanup under its
// advisory lock (one runner per table):
//
//   - Time partitions are created ahead, PartitionsAhead of them past the
//     current one: CREATE TABLE, then ATTACH PARTITION, which takes SHARE
//     UPDATE EXCLUSIVE on the parent and so never blocks a claim (CREATE
//     TABLE … PARTITION OF would take ACCESS EXCLUSIVE).
//   - The oldest time partition is retired once its whole range is past and
//     no key in it is live (a BRIN index on expires_at and locked_until
//     answers without reading the partition). In one transaction, with
//     lock_timeout at maintenanceLockTimeout so that no claim queues behind
//     it for longer: lock the partition against inserts, check again, move
//     the state's low past it (claims of IDs minted before low go to the
//     other partition from then on), detach it. Then drop it. A claim
//     routed by a state read before the move finds no partition and is
//     retried with the state read again. DETACH … CONCURRENTLY is not used:
//     it cannot run in a transaction, so the check, the move and the detach
//     could not be one; the plain DETACH waits at most the lock timeout, on
//     every PostgreSQL version from 13 on.
//   - The single table (the oldest generation of an upgraded deployment)
//     stops being probed once the layout has started and none of its keys
//     is live, after the same check under a lock that keeps takeovers out;
//     it is dropped once every store has read the state since (dropAfter),
//     so that its ACCESS EXCLUSIVE lock waits for no claim.

// maintenanceLockTimeout bounds how long maintenance waits for a lock, and
// so how long a claim can queue behind it.
const maintenanceLockTimeout = "20ms"

// partName is the name of the time partition that starts at start.
func (p *partitioned) partName(start time.Time) string {
	return p.table + "_p" + strconv.FormatInt(start.Unix(), 10)
}

func (p *partitioned) quoted(name string) string { return pgx.Identifier{p.schema, name}.Sanitize() }

// maintain runs partition maintenance on conn (which holds the cleanup
// lock) and returns about how many keys it retired with their partitions.
func (p *partitioned) maintain(ctx context.Context, conn *pgxpool.Conn) (int64, error) {
	defer p.forget()
	var (
		width  time.Duration
		low    *time.Time
		legacy *string
		now    time.Time
	)
	if err := conn.QueryRow(ctx, "SELECT width, low, legacy, now() FROM "+p.state).Scan(&width, &low, &legacy, &now); err != nil {
		return 0, classify("read "+p.state, err)
	}
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, p.parent)
	if err != nil {
		return 0, classify("list the partitions of "+p.parent, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, classify("list the partitions of "+p.parent, err)
	}
	have := map[int64]bool{}
	for _, n := range names {
		if sec, ok := strings.CutPrefix(n, p.table+"_p"); ok {
			if v, err := strconv.ParseInt(sec, 10, 64); err == nil {
				have[v] = true
			}
		}
	}
	first := low == nil
	start := now.Truncate(width)
	if !first {
		start = *low
	}
	horizon := now.Add(time.Duration(p.s.cfg.PartitionsAhead+1) * width)
	for t := start; t.Before(horizon); t = t.Add(width) {
		if !have[t.Unix()] {
			if err := p.createPartition(ctx, conn, t, t.Add(width)); err != nil {
				return 0, err
			}
		}
	}
	if first {
		if _, err := conn.Exec(ctx, "UPDATE "+p.state+" SET low = $1 WHERE low IS NULL", start); err != nil {
			return 0, classify("set the low bound of "+p.parent, err)
		}
	}
	var retired int64
	for t := start; !t.Add(width).After(now) && have[t.Unix()]; t = t.Add(width) {
		n, done, err := p.retirePartition(ctx, conn, t, t.Add(width))
		retired += n
		if err != nil || !done {
			return retired, err
		}
	}
	if legacy != nil {
		p.mu.Lock()
		p.retiredSeen = time.Time{} // not retired (again, after a restore)
		p.mu.Unlock()
		if err := p.retireLegacy(ctx, conn, p.quoted(*legacy)); err != nil {
			return retired, err
		}
	} else if p.table == "exactly_keys2" {
		// The single table of the default state only (migration 00007).
		p.dropRetired(ctx, conn)
	}
	return retired, nil
}

// createPartition creates the time partition [lo, hi) apart and attaches it.
func (p *partitioned) createPartition(ctx context.Context, conn *pgxpool.Conn, lo, hi time.Time) error {
	name := p.partName(lo)
	q := p.quoted(name)
	op := "create partition " + q
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+q+" (LIKE "+p.parent+" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"); err != nil {
		return classify(op, err)
	}
	// The partition belongs to the partitioned table's owner, not to the
	// role that ran this: any other member of the owner role can retire it.
	var owner string
	if err := conn.QueryRow(ctx, "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = $1::regclass", p.parent).Scan(&owner); err != nil {
		return classify(op, err)
	}
	if _, err := conn.Exec(ctx, "ALTER TABLE "+q+" OWNER TO "+pgx.Identifier{owner}.Sanitize()); err != nil {
		return classify(op, err)
	}
	// It gets the partitioned table's grants, so that a consumer role
	// granted the table (docs/grants.md) claims in the partition by its
	// own name, a plan made once (target).
	rows, err := conn.Query(ctx, `SELECT format('GRANT %s ON %s TO %s', a.privilege_type, $2::text,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END)
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a WHERE c.oid = $1::regclass AND a.grantee <> c.relowner`, p.parent, q)
	if err != nil {
		return classify(op, err)
	}
	grants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return classify(op, err)
	}
	for _, g := range grants {
		if _, err := conn.Exec(ctx, g); err != nil {
			return classify(op, err)
		}
	}
	if _, err := conn.Exec(ctx, "CREATE INDEX IF NOT EXISTS "+pgx.Identifier{name + "_live"}.Sanitize()+" ON "+q+
		" USING brin (expires_at, locked_until)"); err != nil {
		return classify(op, err)
	}
	// The ATTACH waits for its lock at most maintenanceLockTimeout, so that
	// no claim queues behind it; a lock busy for longer (another session's
	// DDL on the key table, a LOCK TABLE) is waited out in attempts, for up
	// to attachPatience.
	wait := backoff.New(10*time.Millisecond, 500*time.Millisecond)
	giveUp := time.Now().Add(attachPatience)
	for {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+maintenanceLockTimeout+"'"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ALTER TABLE "+p.parent+" ATTACH PARTITION "+q+
				" FOR VALUES FROM ('"+timeBound(lo)+"') TO ('"+timeBound(hi)+"')")
			return err
		})
		if !lockBusy(err) || time.Now().After(giveUp) {
			return classify(op, err)
		}
		if serr := wait.SleepJittered(ctx); serr != nil {
			return classify(op, errors.Join(err, serr))
		}
	}
}

// attachPatience is how long a partition's ATTACH is tried again while its
// lock is busy.
const attachPatience = 10 * time.Second

// liveSQL finds a live key in a partition: not expired, or leased.
const liveSQL = `SELECT EXISTS (SELECT FROM {T} WHERE expires_at >= now() OR locked_until >= now())`

// retirePartition detaches and drops the time partition [lo, hi) if no key
// in it is live; done is false when it could not (yet).
func (p *partitioned) retirePartition(ctx context.Context, conn *pgxpool.Conn, lo, hi time.Time) (n int64, done bool, err error) {
	name := p.partName(lo)
	q := p.quoted(name)
	op := "retire partition " + q
	live := strings.ReplaceAll(liveSQL, "{T}", q)
	if _, err := conn.Exec(ctx, "SELECT brin_summarize_new_values($1::regclass)", p.quoted(name+"_live")); err != nil {
		return 0, false, classify(op, err)
	}
	var busy bool
	if err := conn.QueryRow(ctx, live).Scan(&busy); err != nil || busy {
		return 0, false, classify(op, err)
	}
	var tuples float64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+maintenanceLockTimeout+"'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+q+" IN SHARE MODE"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, live).Scan(&busy); err != nil || busy {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = $1::regclass", q).Scan(&tuples); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE "+p.state+" SET low = $1 WHERE low < $1", hi); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "ALTER TABLE "+p.parent+" DETACH PARTITION "+q)
		return err
	})
	if lockBusy(err) || busy {
		p.s.cfg.Logger.DebugContext(ctx, "pgstore: partition not retired yet", "partition", q, "live keys", busy, "err", err)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, classify(op, err)
	}
	if _, err := conn.Exec(ctx, "DROP TABLE "+q); err != nil {
		return 0, false, classify(op, err)
	}
	p.s.cfg.Logger.InfoContext(ctx, "pgstore: key partition dropped", "partition", q, "from", lo, "to", hi, "keys", int64(tuples))
	return int64(tuples), true, nil
}

// retireLegacy stops the single table's probing once the partitioned
// layout has started on the schema and none of its keys is live (not
// expired, nor leased: a claim's test, legacyLiveRow). From the start on
// no store of the single table claims a key there (migration 00008), so
// nothing it holds matters any more; before the start, stores of the
// single table may still be claiming, and the table is left alone. The
// retire locks the table in SHARE ROW EXCLUSIVE mode, which waits for the
// transactions that wrote there and does not conflict with the probes of
// claims in flight, and creates its update guard (migration 00009): from
// then on a write there is refused (EXK02), whatever the writer's
// snapshot. The table is dropped later
// (dropRetired), once no store reads it.
func (p *partitioned) retireLegacy(ctx context.Context, conn *pgxpool.Conn, legacy string) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", legacy).Scan(&exists); err != nil {
		return classify("retire "+legacy, err)
	}
	live := `SELECT EXISTS (SELECT FROM ` + legacy + ` o WHERE ` + legacyLiveRow + `), EXISTS (SELECT FROM ` + legacy + `)`
	// held: the table holds keys, all expired (an upgraded deployment);
	// an empty one is a fresh schema's (or its keys were cleaned up), and
	// its retire is no news.
	var busy, held bool
	if exists {
		if err := conn.QueryRow(ctx, live).Scan(&busy, &held); err != nil || busy {
			return classify("retire "+legacy, err)
		}
	}
	// READ COMMITTED whatever the session's default: the function's check
	// must see what the writers it waits for committed.
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+maintenanceLockTimeout+"'"); err != nil {
			return err
		}
		// Locks the table (waiting for its writers), checks again that no
		// key is live there, creates the table's update guard and clears
		// the state's legacy (migration 00009); false when it kept the
		// table.
		var retired bool
		if err := tx.QueryRow(ctx, "SELECT "+pgx.Identifier{p.schema, "exactly_keys2_retire"}.Sanitize()+"()").Scan(&retired); err != nil {
			return err
		}
		busy = !retired
		return nil
	})
	if lockBusy(err) || busy {
		return nil
	}
	if err != nil {
		return classify("retire "+legacy, err)
	}
	if held {
		p.s.cfg.Logger.InfoContext(ctx, "pgstore: every key of the single key table (the layout before the partitioned one) has expired; "+
			"claims no longer read it, and it is dropped once no store reads it", "table", legacy)
	} else {
		p.s.cfg.Logger.DebugContext(ctx, "pgstore: the single key table is empty and no longer read; it is dropped once no store reads it", "table", legacy)
	}
	return nil
}

// singleTableName is the single table's name, the oldest generation of an
// upgraded deployment (migration 00007 names it in the state).
const singleTableName = "exactly_keys"

// dropRetired drops the single table once the partitioned layout has
// started and retired it, and no store reads it any more: a store trusts
// the state it read for stateTTL, so the table is dropped only once this
// store has seen it retired for dropAfter (twice that). A role that does
// not own it leaves it to the owner. A failure (a lock held, an object of
// the user's that depends on it) is logged, not returned: the rest of the
// clean-up goes on, and the next run tries again.
func (p *partitioned) dropRetired(ctx context.Context, conn *pgxpool.Conn) {
	table := p.quoted(singleTableName)
	var droppable, held bool
	err := conn.QueryRow(ctx, `SELECT coalesce((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass($1)), false)
       AND (SELECT started_at IS NOT NULL AND legacy IS NULL FROM `+p.state+`)`, table).Scan(&droppable)
	p.mu.Lock()
	if err != nil || !droppable {
		p.retiredSeen = time.Time{}
		p.mu.Unlock()
		return
	}
	if p.retiredSeen.IsZero() {
		p.retiredSeen = p.now()
	}
	wait := p.dropAfter - p.now().Sub(p.retiredSeen)
	p.mu.Unlock()
	if wait > 0 {
		return
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+maintenanceLockTimeout+"'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT started_at IS NOT NULL AND legacy IS NULL FROM "+p.state).Scan(&droppable); err != nil || !droppable {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+table+")").Scan(&held); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DROP TABLE "+table)
		return err
	})
	switch {
	case lockBusy(err) || !droppable:
	case err != nil:
		p.s.cfg.Logger.WarnContext(ctx, "pgstore: could not drop the retired single key table; the clean-up goes on, and tries again at its next run",
			"table", table, "err", err)
	case held:
		p.s.cfg.Logger.InfoContext(ctx, "pgstore: the retired single key table dropped, with its expired keys", "table", table)
	default:
		p.s.cfg.Logger.DebugContext(ctx, "pgstore: the retired single key table, empty, dropped", "table", table)
	}
}

func lockBusy(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

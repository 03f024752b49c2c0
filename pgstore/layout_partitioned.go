package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
)

// The partitioned layout (LayoutPartitioned): its state and codes in
// layout_partitioned_state.go, its statements (pgx named arguments) in
// layout_partitioned_sql.go, its batches, stats and partition maintenance
// in the files beside them. A key is looked for in the legacy table first
// while it serves as the oldest generation (no key is inserted there any
// more, so a plain read suffices), then claimed in the partition of its ID.

var _ layout = (*partitioned)(nil)

// partArgs are a claim's arguments in the partitioned layout.
type partArgs struct {
	sid       storedID
	scopeCode int16
	topicCode *int16
	fp        []byte
	width     time.Duration
	// legacy is the legacy table probed as the oldest generation, as the
	// layout's state named it (quoted); "" once it is retired.
	legacy string
}

// prepareClaim reads the layout's state (cached) and the codes of the
// scope and topic names on db, so that no claim waits for a second
// connection of the pool.
func (p *partitioned) prepareClaim(ctx context.Context, db DBTX, req dedupe.Request, a claimArgs) (claimArgs, error) {
	fresh := p.stale()
	st, err := p.layoutState(ctx, db)
	if err != nil {
		return claimArgs{}, err
	}
	if _, pooled := db.(*pgxpool.Pool); pooled && st.low.IsZero() {
		if st, err = p.firstPartitions(ctx); err != nil {
			return claimArgs{}, err
		}
	}
	if st.low.IsZero() {
		return claimArgs{}, fmt.Errorf("pgstore: claim %s: %s has no time partitions yet: %w: call Store.Check at start-up "+
			"(or Cleanup), which creates them", req.Key, p.parent, dedupe.ErrMisconfigured)
	}
	pa := &partArgs{sid: encodeID(req.Key.ID, st.low), width: st.width, legacy: st.legacy}
	if pa.sid.timed && !pa.sid.minted.Before(st.high) {
		// No partition holds it as far as the state read says: read it
		// again, then judge from the partitions that exist.
		if !fresh {
			p.forget()
			if st, err = p.layoutState(ctx, db); err != nil {
				return claimArgs{}, err
			}
			pa = &partArgs{sid: encodeID(req.Key.ID, st.low), width: st.width, legacy: st.legacy}
		}
		if err := p.beyondPartitions(req, pa.sid, st); err != nil {
			return claimArgs{}, err
		}
	}
	if pa.scopeCode, err = p.code(ctx, db, req.Key.Scope); err != nil {
		return claimArgs{}, err
	}
	if a.topic != nil {
		c, err := p.code(ctx, db, *a.topic)
		if err != nil {
			return claimArgs{}, err
		}
		pa.topicCode = &c
	}
	pa.fp, _ = hex.DecodeString(a.fingerprint) // validated: 64 hex digits
	a.part = pa
	if !a.batch {
		a.q = p.queriesFor(st, p.target(st, pa.sid))
	}
	return a, nil
}

// named returns a claim's named arguments, with more (partNamed).
func (p *partitioned) named(a claimArgs, more pgx.NamedArgs) pgx.QueryRewriter {
	return &partNamed{a: &a, more: more}
}

func (p *partitioned) claimParams(a claimArgs) []any { return []any{p.named(a, nil)} }

func (p *partitioned) lockParams(a claimArgs) []any { return []any{p.named(a, nil)} }

func (p *partitioned) takeoverParams(a claimArgs, attempts int) []any {
	return []any{p.named(a, pgx.NamedArgs{"attempts": attempts})}
}

// claimError classifies a claim statement's error: a key whose time
// partition does not exist was routed by a state that maintenance changed
// meanwhile (retry: the state is read again), or was minted beyond the
// partitions created ahead.
func (p *partitioned) claimError(req dedupe.Request, a claimArgs, err error) error {
	if !layoutChanged(err) {
		return classify("claim "+req.Key.String(), err)
	}
	p.forget()
	if pgerr.IsSingleTableRetired(err) {
		return dedupe.Retryable(fmt.Errorf("pgstore: claim %s: the single key table was retired under the claim (its key "+
			"had expired): it is claimed again on %s: %w", req.Key, p.parent, err))
	}
	minted := a.part.sid.minted
	return dedupe.Retryable(fmt.Errorf("pgstore: claim %s: no partition of %s holds its time %s: the partitions changed "+
		"meanwhile, or Cleanup (which creates them ahead) has not run for a while: %w",
		req.Key, p.parent, minted.UTC().Format(time.RFC3339), err))
}

// layoutChanged reports whether err says that the partitioned layout
// changed under a statement built from a state read before: the
// partitioned table found no partition for a key (23514), or a table the
// statement names is gone (42P01: the legacy table, dropped once it was
// retired), or the legacy table refused a write once retired (EXK02,
// migration 00009). The state is read again and the transaction retried.
func layoutChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition") || pgErr.Code == "42P01" ||
		pgErr.Code == pgerr.SingleTableRetiredCode)
}

// beyondPartitions returns the InvalidKeyError of a request whose ID (sid)
// was minted beyond every time partition that exists (st, freshly read)
// and beyond those that maintenance creates ahead of the database's clock,
// which no maintenance run would create in time; nil for any other.
func (p *partitioned) beyondPartitions(req dedupe.Request, sid storedID, st layoutState) error {
	if !sid.timed || sid.minted.Before(st.high) {
		return nil
	}
	minted := sid.minted
	horizon := st.dbClock(p.now()).Add(time.Duration(p.s.cfg.PartitionsAhead+1) * st.width)
	if minted.After(horizon) {
		return &dedupe.InvalidKeyError{Key: req.Key, Reason: fmt.Sprintf("its ID was minted at %s, beyond the key partitions "+
			"created ahead (until about %s): the producer's clock is ahead", minted.UTC().Format(time.RFC3339), horizon.UTC().Format(time.RFC3339))}
	}
	return nil
}

// layoutError classifies the error of a statement built from the layout's
// state: a key with no partition to go to, or a table gone, makes the
// transaction retry once the state has been read again.
func (p *partitioned) layoutError(op string, err error) error {
	if layoutChanged(err) {
		p.forget()
		return dedupe.Retryable(fmt.Errorf("pgstore: %s: the tables of %s changed under the transaction (a partition retired, "+
			"the legacy table dropped), or Cleanup (which creates the partitions ahead) has not run for a while: %w", op, p.parent, err))
	}
	return classify(op, err)
}

// prepareBatch reads (or adds) the codes of the scopes and topics of reqs
// before a transaction holds a connection.
func (p *partitioned) prepareBatch(ctx context.Context, reqs []dedupe.Request) error {
	for _, r := range reqs {
		if _, err := p.code(ctx, p.s.pool, r.Key.Scope); err != nil {
			return err
		}
		if r.Source.Topic != "" {
			if _, err := p.code(ctx, p.s.pool, r.Source.Topic); err != nil {
				return err
			}
		}
	}
	return nil
}

// beforeBatchTx reads the layout's state before the connection is taken
// (and again on it, should it go stale meanwhile).
func (p *partitioned) beforeBatchTx(ctx context.Context) error {
	_, err := p.firstPartitions(ctx)
	return err
}

// firstPartitions returns the layout's state read on the pool, after
// creating the first partitions when there are none yet (Check does), so
// that a store whose Check was never called claims all the same. The
// role needs the clean-up's rights for that (CheckMaintenance); without
// them the error says so.
func (p *partitioned) firstPartitions(ctx context.Context) (layoutState, error) {
	st, err := p.layoutState(ctx, p.s.pool)
	if err != nil || !st.low.IsZero() {
		return st, err
	}
	if err := p.check(ctx); err != nil {
		return layoutState{}, err
	}
	return p.layoutState(ctx, p.s.pool)
}

// keyArgs are the arguments for statements on an existing key, read on db
// (see prepareClaim).
func (p *partitioned) keyArgs(ctx context.Context, db DBTX, key dedupe.Key) (claimArgs, error) {
	return p.s.newClaimArgs(ctx, db, dedupe.Request{Key: key, Fingerprint: zeroFingerprint}, dedupe.StatusCompleted, 0)
}

// zeroFingerprint stands for a fingerprint where a statement needs none.
var zeroFingerprint = dedupe.Fingerprint(strings.Repeat("0", 64))

func (p *partitioned) update(ctx context.Context, db DBTX, key dedupe.Key, u keyUpdate) (int64, error) {
	a, err := p.keyArgs(ctx, db, key)
	if err != nil {
		return 0, err
	}
	stmt, more := a.q.result, pgx.NamedArgs{"result": u.result}
	switch u.op {
	case updateComplete:
		stmt, more = a.q.complete, pgx.NamedArgs{"attempts": u.attempts, "result": u.result, "ttl": u.ttlMicros}
	case updateRelease:
		stmt, more = a.q.release, pgx.NamedArgs{"attempts": u.attempts}
	case updateExtend:
		stmt, more = a.q.extend, pgx.NamedArgs{"attempts": u.attempts, "lease": u.leaseMicros}
	}
	var n int64
	err = db.QueryRow(ctx, stmt, p.named(a, more)).Scan(&n)
	if pgerr.IsSingleTableRetired(err) {
		// The key was in the single table, which the clean-up retired
		// since: it had expired, and its lease with it.
		p.forget()
		return 0, nil
	}
	if layoutChanged(err) {
		err = p.layoutError("update "+key.String(), err)
	}
	return n, err
}

func (p *partitioned) resultOne(ctx context.Context, db DBTX, key dedupe.Key, result []byte) (string, []any, error) {
	a, err := p.keyArgs(ctx, db, key)
	if err != nil {
		return "", nil, err
	}
	return a.q.resultOne, []any{p.named(a, pgx.NamedArgs{"result": result})}, nil
}

func (p *partitioned) get(ctx context.Context, db DBTX, key dedupe.Key) (keyRow, error) {
	// A scope with no code has no key in the partitioned table: a read
	// adds no name, so that it never waits for a transaction adding the
	// same one (the first claim of a scope, still running). Its keys may
	// still be in the single table while that is read.
	if _, ok := p.codes.Load(key.Scope); !ok {
		var n int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM "+p.names+" WHERE name = $1", key.Scope).Scan(&n); err != nil {
			return keyRow{}, classify(fmt.Sprintf("code of %q", key.Scope), err)
		}
		if n == 0 {
			// The state as it is, not the cache: a read starts nothing.
			var legacy *string
			if err := db.QueryRow(ctx, "SELECT legacy FROM "+p.state).Scan(&legacy); err != nil || legacy == nil {
				return keyRow{}, p.layoutError("get "+key.String(), err)
			}
			row, err := scanKeyRow(db.QueryRow(ctx, "SELECT false, "+prefixedOldCols+", clock_timestamp() FROM "+p.quoted(*legacy)+
				" o WHERE o.scope = $1 AND o.key = $2", key.Scope, key.ID))
			if err != nil {
				return keyRow{}, p.layoutError("get "+key.String(), err)
			}
			return row, nil
		}
	}
	a, err := p.keyArgs(ctx, db, key)
	if err != nil {
		return keyRow{}, err
	}
	row, err := scanKeyRow(db.QueryRow(ctx, a.q.get, p.named(a, nil)))
	if err != nil {
		return keyRow{}, p.layoutError("get "+key.String(), err)
	}
	return row, nil
}

// cleanup runs partition maintenance, then deletes expired keys from the
// partition of keys that are not time-ordered.
func (p *partitioned) cleanup(ctx context.Context, conn *pgxpool.Conn) (int64, string, error) {
	retired, err := p.maintain(ctx, conn)
	return retired, p.cleanupSQL, err
}

// check checks the partitioned layout's tables and creates the time
// partitions if there are none yet.
func (p *partitioned) check(ctx context.Context) error {
	if _, err := p.s.pool.Exec(ctx, "SELECT kid, scope, kind, status, fingerprint FROM "+p.parent+" LIMIT 0"); err != nil {
		return classify("check "+p.parent, err)
	}
	for {
		p.forget()
		st, err := p.layoutState(ctx, p.s.pool)
		if err != nil {
			return err
		}
		if !st.low.IsZero() {
			return nil
		}
		_, err = p.s.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1})
		if err != nil && !errors.Is(err, dedupe.ErrCleanupBusy) {
			return fmt.Errorf("pgstore: check %s: create its partitions: %w", p.parent, err)
		}
		if errors.Is(err, dedupe.ErrCleanupBusy) {
			select { // another runner is creating them
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (p *partitioned) stateTable() string { return p.state }

// missingRights: maintenance creates, attaches, detaches and drops
// partitions and moves the layout's state.
func (p *partitioned) missingRights(r maintenanceRights) []string {
	var missing []string
	if !r.owns {
		missing = append(missing, "ownership of "+p.parent+" (membership in its owner role)")
	}
	if !r.create {
		missing = append(missing, "CREATE on schema "+pgx.Identifier{p.schema}.Sanitize())
	}
	if !r.state {
		missing = append(missing, "UPDATE on "+p.state)
	}
	return missing
}

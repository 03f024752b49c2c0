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
)

// The claim protocol, in one place:
//
//  1. claimSQL inserts the key or reports the stored row, in one statement
//     (Do sends it in the same round trip as BEGIN: beginClaim).
//  2. When the conflicting row was committed by a transaction the statement
//     waited for, nothing comes back: lockSQL reads it FOR UPDATE.
//  3. dedupe.Decide decides on the stored row.
//  4. A key whose lease expired is taken over with takeoverSQL, fenced by
//     the attempts count that was read; a lost race goes back to step 1.
//
// The same steps run on both layouts (Config.Layout): the partitioned
// layout's statements (sql.go) answer in the legacy columns. There, a key
// is looked for in the legacy table first while it serves as the oldest
// generation (no key is inserted there any more, so a plain read suffices),
// then claimed in the partition of its ID.

// claimArgs are the arguments of one claim, built once and shared by its
// statements.
type claimArgs struct {
	scope, id   string
	fingerprint string
	// status is the status a claimed key gets: COMPLETED in a transaction
	// (nothing outside it can see the row before commit), PROCESSING under
	// a lease.
	status dedupe.Status
	// topic, partition and offset are the message's source; NULL when unknown.
	topic     *string
	partition *int32
	offset    *int64
	// leaseMicros and ttlMicros are durations in microseconds.
	leaseMicros, ttlMicros float64
	// q are the statements for the store's layout (and, for the partitioned
	// layout, its state).
	q *queries
	// part is set for the partitioned layout: the key as it is stored.
	part *partArgs
}

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

// newClaimArgs validates req and builds its claim's arguments. For the
// partitioned layout it reads the layout's state (cached) and the codes of
// the scope and topic names on db: the pool when the caller holds no
// connection of it, else the connection or transaction it holds, so that
// no claim waits for a second connection of the pool.
func (s *Store) newClaimArgs(ctx context.Context, db DBTX, req dedupe.Request, status dedupe.Status, lease time.Duration) (claimArgs, error) {
	if err := req.Validate(); err != nil {
		return claimArgs{}, err
	}
	a := claimArgs{
		scope: req.Key.Scope, id: req.Key.ID, fingerprint: string(req.Fingerprint), status: status,
		leaseMicros: micros(lease), ttlMicros: micros(s.ttl(req)), q: &s.q,
	}
	if req.Source != (dedupe.Source{}) {
		src := req.Source
		a.topic, a.partition, a.offset = &src.Topic, &src.Partition, &src.Offset
	}
	if s.part == nil {
		return a, nil
	}
	p := s.part
	fresh := p.stale()
	st, err := p.layoutState(ctx, db)
	if err != nil {
		return claimArgs{}, err
	}
	if _, pooled := db.(*pgxpool.Pool); pooled && st.low.IsZero() {
		if st, err = s.firstPartitions(ctx); err != nil {
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
		if err := s.beyondPartitions(req, pa.sid, st); err != nil {
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
	a.part, a.q = pa, p.queriesFor(st, p.target(st, pa.sid))
	return a, nil
}

// named returns the partitioned layout's named arguments, with more.
func (a *claimArgs) named(more pgx.NamedArgs) pgx.NamedArgs {
	pa := a.part
	n := pgx.NamedArgs{
		"scope": a.scope, "id": a.id, "fp": pa.fp, "status": string(a.status), "topic": pa.topicCode, "part": a.partition,
		"off": a.offset, "lease": a.leaseMicros, "ttl": a.ttlMicros, "scode": pa.scopeCode, "kid": pa.sid.kid,
		"kind": string(pa.sid.kind), "idtext": pa.sid.text, "tname": a.topic,
	}
	for k, v := range more {
		n[k] = v
	}
	return n
}

// claimSQLArgs are claimSQL's arguments.
func (a *claimArgs) claimSQLArgs() []any {
	if a.part != nil {
		return []any{a.named(nil)}
	}
	return []any{a.scope, a.id, a.fingerprint, string(a.status), a.topic, a.partition, a.offset, a.leaseMicros, a.ttlMicros}
}

// lockSQLArgs are lockSQL's arguments.
func (a *claimArgs) lockSQLArgs() []any {
	if a.part != nil {
		return []any{a.named(nil)}
	}
	return []any{a.scope, a.id}
}

// takeoverSQLArgs are takeoverSQL's arguments, fenced by the attempts count read.
func (a *claimArgs) takeoverSQLArgs(attempts int) []any {
	if a.part != nil {
		return []any{a.named(pgx.NamedArgs{"attempts": attempts})}
	}
	return []any{a.scope, a.id, attempts, string(a.status), a.topic, a.partition, a.offset, a.leaseMicros, a.ttlMicros}
}

// keyRow is one row of (inserted, cols..., clock_timestamp()), as the claim,
// lock, takeover and get statements return it.
type keyRow struct {
	rec dedupe.Record
	// inserted: the claim statement inserted the key.
	inserted bool
	// now is the database's clock when the row was read.
	now time.Time
	// found: a row came back.
	found bool
}

// claim runs the claim protocol for req on db.
func (s *Store) claim(ctx context.Context, db DBTX, req dedupe.Request, status dedupe.Status, lease time.Duration) (dedupe.Claim, error) {
	a, err := s.newClaimArgs(ctx, db, req, status, lease)
	if err != nil {
		return dedupe.Claim{}, err
	}
	row, err := scanKeyRow(db.QueryRow(ctx, a.q.claim, a.claimSQLArgs()...))
	return s.resolveClaim(ctx, db, req, &a, row, err)
}

// resolveClaim finishes a claim whose claim statement answered row (or
// rowErr): steps 2 to 4.
func (s *Store) resolveClaim(ctx context.Context, db DBTX, req dedupe.Request, a *claimArgs, row keyRow, rowErr error) (dedupe.Claim, error) {
	// A takeover can lose its race to another worker; the loop re-reads and
	// decides again. A handful of rounds is plenty: each lost round means
	// another worker made progress.
	for round := 0; round < 8; round++ {
		if round > 0 {
			row, rowErr = scanKeyRow(db.QueryRow(ctx, a.q.claim, a.claimSQLArgs()...))
		}
		if rowErr != nil {
			return dedupe.Claim{}, s.claimError(req, a, rowErr)
		}
		if !row.found {
			locked, err := scanKeyRow(db.QueryRow(ctx, a.q.lock, a.lockSQLArgs()...))
			if err != nil {
				return dedupe.Claim{}, s.claimError(req, a, err)
			}
			if !locked.found {
				continue // deleted by cleanup meanwhile: claim again
			}
			row = locked
		}
		if row.inserted {
			return dedupe.Claim{Decision: dedupe.DecisionNew, Record: row.rec, TTL: req.TTL}, nil
		}
		decision, err := dedupe.Decide(row.rec, req.Fingerprint, row.now)
		if err != nil || decision == dedupe.DecisionDuplicate {
			return dedupe.Claim{Decision: decision, Record: row.rec, TTL: req.TTL}, err
		}
		taken, err := scanKeyRow(db.QueryRow(ctx, a.q.takeover, a.takeoverSQLArgs(row.rec.Attempts)...))
		if err != nil {
			return dedupe.Claim{}, s.claimError(req, a, err)
		}
		if taken.found {
			return dedupe.Claim{Decision: dedupe.DecisionTakeover, Record: taken.rec, TTL: req.TTL}, nil
		}
	}
	return dedupe.Claim{}, dedupe.Retryable(fmt.Errorf("pgstore: claim %s: the key kept changing under concurrent claims", req.Key))
}

// beginClaim acquires a connection and sends BEGIN and the claim statement
// in one round trip (a pgx batch, which pgx's own transaction type cannot
// do), then finishes the claim in the transaction it opened. The
// transaction is returned whenever it was opened, also with the claim's
// error: the caller rolls it back.
func (s *Store) beginClaim(ctx context.Context, req dedupe.Request) (*connTx, dedupe.Claim, error) {
	a, err := s.newClaimArgs(ctx, s.pool, req, dedupe.StatusCompleted, 0)
	if err != nil {
		return nil, dedupe.Claim{}, err
	}
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, dedupe.Claim{}, classify("begin", err)
	}
	tx := &connTx{pc: pc, conn: pc.Conn()}
	b := &pgx.Batch{}
	b.Queue(s.beginSQL)
	b.Queue(a.q.claim, a.claimSQLArgs()...)
	br := tx.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		tx.end(ctx, true)
		if layoutChanged(err) { // the batch's claim statement could not be prepared
			return nil, dedupe.Claim{}, s.claimError(req, &a, err)
		}
		return nil, dedupe.Claim{}, classify("begin", err)
	}
	row, rowErr := scanKeyRow(br.QueryRow())
	if err := br.Close(); err != nil && rowErr == nil {
		rowErr = err
	}
	c, err := s.resolveClaim(ctx, tx, req, &a, row, rowErr)
	return tx, c, err
}

// claimError classifies the claim statement's error. In the partitioned
// layout, a key whose time partition does not exist was routed by a state
// that maintenance changed meanwhile (retry: the state is read again), or
// was minted beyond the partitions created ahead.
func (s *Store) claimError(req dedupe.Request, a *claimArgs, err error) error {
	if a.part == nil || !layoutChanged(err) {
		return classify("claim "+req.Key.String(), err)
	}
	s.part.forget()
	minted := a.part.sid.minted
	return dedupe.Retryable(fmt.Errorf("pgstore: claim %s: no partition of %s holds its time %s: the partitions changed "+
		"meanwhile, or Cleanup (which creates them ahead) has not run for a while: %w",
		req.Key, s.part.parent, minted.UTC().Format(time.RFC3339), err))
}

// layoutChanged reports whether err says that the partitioned layout
// changed under a statement built from a state read before: the
// partitioned table found no partition for a key (23514), or a table the
// statement names is gone (42P01: the legacy table, dropped once it was
// retired). The state is read again and the transaction retried.
func layoutChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition") || pgErr.Code == "42P01")
}

// beyondPartitions returns the InvalidKeyError of a request whose ID (sid)
// was minted beyond every time partition that exists (st, freshly read)
// and beyond those that maintenance creates ahead of the database's clock,
// which no maintenance run would create in time; nil for any other.
func (s *Store) beyondPartitions(req dedupe.Request, sid storedID, st layoutState) error {
	if !sid.timed || sid.minted.Before(st.high) {
		return nil
	}
	minted := sid.minted
	horizon := st.dbClock(s.part.now()).Add(time.Duration(s.cfg.PartitionsAhead+1) * st.width)
	if minted.After(horizon) {
		return &dedupe.InvalidKeyError{Key: req.Key, Reason: fmt.Sprintf("its ID was minted at %s, beyond the key partitions "+
			"created ahead (until about %s): the producer's clock is ahead", minted.UTC().Format(time.RFC3339), horizon.UTC().Format(time.RFC3339))}
	}
	return nil
}

// scanKeyRow reads one row of (inserted, cols..., clock_timestamp()); no
// row is found=false, not an error.
func scanKeyRow(row pgx.Row) (keyRow, error) {
	var (
		r                   keyRow
		fp, status          string
		topic               *string
		partition           *int32
		offset              *int64
		completed, lockedTo *time.Time
	)
	rec := &r.rec
	err := row.Scan(&r.inserted, &rec.Key.Scope, &rec.Key.ID, &fp, &status, &rec.Result, &rec.Attempts,
		&topic, &partition, &offset, &rec.CreatedAt, &completed, &lockedTo, &rec.ExpiresAt, &r.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return keyRow{}, nil
	}
	if err != nil {
		return keyRow{}, err
	}
	r.found = true
	rec.Fingerprint, rec.Status = dedupe.Fingerprint(fp), dedupe.Status(status)
	if topic != nil {
		rec.Source.Topic = *topic
	}
	if partition != nil {
		rec.Source.Partition = *partition
	}
	if offset != nil {
		rec.Source.Offset = *offset
	}
	if completed != nil {
		rec.CompletedAt = *completed
	}
	if lockedTo != nil {
		rec.LockedUntil = *lockedTo
	}
	return r, nil
}

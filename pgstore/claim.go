package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
// The same steps run on both layouts (Config.Layout): each layout (the
// layout interface) gives the statements and their arguments, which answer
// in the same columns.

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
	// layout, its state), set by the layout's prepareClaim.
	q *queries
	// part is the key as the partitioned layout stores it (its
	// prepareClaim sets it); nil on the single table.
	part *partArgs
	// batch: the arguments are for a batch statement, which brings its own
	// statements: the partitioned layout leaves q nil.
	batch bool
}

// newClaimArgs validates req and builds its claim's arguments, the
// layout's part read on db: the pool when the caller holds no connection of
// it, else the connection or transaction it holds, so that no claim waits
// for a second connection of the pool.
func (s *Store) newClaimArgs(ctx context.Context, db DBTX, req dedupe.Request, status dedupe.Status, lease time.Duration) (claimArgs, error) {
	if err := req.Validate(); err != nil {
		return claimArgs{}, err
	}
	return s.validClaimArgs(ctx, db, req, status, lease, false)
}

// validClaimArgs is newClaimArgs of a request already validated; for a
// batch statement (batch), which brings statements of its own, the
// one-key statements (a.q) are left unset.
func (s *Store) validClaimArgs(ctx context.Context, db DBTX, req dedupe.Request, status dedupe.Status, lease time.Duration, batch bool) (claimArgs, error) {
	a := claimArgs{batch: batch,
		scope: req.Key.Scope, id: req.Key.ID, fingerprint: string(req.Fingerprint), status: status,
		leaseMicros: micros(lease), ttlMicros: micros(s.ttl(req)),
	}
	if req.Source != (dedupe.Source{}) {
		src := req.Source
		a.topic, a.partition, a.offset = &src.Topic, &src.Partition, &src.Offset
	}
	return s.l.prepareClaim(ctx, db, req, a)
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
	row, err := scanKeyRow(db.QueryRow(ctx, a.q.claim, s.l.claimParams(a)...))
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
			row, rowErr = scanKeyRow(db.QueryRow(ctx, a.q.claim, s.l.claimParams(*a)...))
		}
		if rowErr != nil {
			return dedupe.Claim{}, s.l.claimError(req, *a, rowErr)
		}
		if !row.found {
			locked, err := scanKeyRow(db.QueryRow(ctx, a.q.lock, s.l.lockParams(*a)...))
			if err != nil {
				return dedupe.Claim{}, s.l.claimError(req, *a, err)
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
		taken, err := scanKeyRow(db.QueryRow(ctx, a.q.takeover, s.l.takeoverParams(*a, row.rec.Attempts)...))
		if err != nil {
			return dedupe.Claim{}, s.l.claimError(req, *a, err)
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
	return s.beginLockClaim(ctx, req, false)
}

// beginLockClaim is beginClaim, with lock the key's lock (TryLockKeyTx's)
// taken without waiting between BEGIN and the claim, in the same round
// trip: when another transaction holds it, the claim does not run, the
// transaction is rolled back and the error is errKeyLocked.
func (s *Store) beginLockClaim(ctx context.Context, req dedupe.Request, lock bool) (*connTx, dedupe.Claim, error) {
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
	if lock {
		b.Queue(lockOrFailSQL, s.keyLockID(req.Key))
	}
	claim := a.q.claim
	if lock {
		// The key's lock keeps other requests from its row, and a request's
		// key is stored only when its client retries: the claim only
		// inserts (queries.claimNew).
		claim = a.q.claimNew
	}
	b.Queue(claim, s.l.claimParams(a)...)
	br := tx.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		tx.end(ctx, true)
		if layoutChanged(err) { // the batch's claim statement could not be prepared
			return nil, dedupe.Claim{}, s.l.claimError(req, a, err)
		}
		return nil, dedupe.Claim{}, classify("begin", err)
	}
	if lock {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			rerr := tx.Rollback(ctx)
			if isKeyLocked(err) && rerr == nil {
				return nil, dedupe.Claim{}, errKeyLocked
			}
			return nil, dedupe.Claim{}, fmt.Errorf("pgstore: lock %s: %w", req.Key, err)
		}
	}
	row, rowErr := scanKeyRow(br.QueryRow())
	if err := br.Close(); err != nil && rowErr == nil {
		rowErr = err
	}
	c, err := s.resolveClaim(ctx, tx, req, &a, row, rowErr)
	return tx, c, err
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

package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// claimBatch claims the keys of reqs at order (sorted, distinct, valid)
// and writes their answers into out.
func (s *Store) claimBatch(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, order []int, out []BatchClaim, begin bool) error {
	// alone are the requests claimed one at a time after the batch statement.
	st, alone, begin, err := s.l.batchStmts(ctx, tx, reqs, order, out, begin)
	if err != nil {
		return err
	}
	n := len(st.order)
	op := fmt.Sprintf("claim a batch of %d keys", n)
	found := make(map[dedupe.Key]bool, n)
	var at map[dedupe.Key]int
	// read scans the rows of the claim or the lock statement.
	read := func(rows pgx.Rows) error {
		for rows.Next() {
			kr, err := scanKeyRow(rows)
			if err != nil {
				rows.Close()
				return err
			}
			if kr.inserted && kr.rec.Key.ID == "" {
				// allInserted: every key was inserted at kr.rec.CreatedAt.
				s.batchFoundStored.Store(false)
				for _, i := range st.order {
					found[reqs[i].Key] = true
					out[i].Claim = s.insertedClaim(reqs[i], kr.rec.CreatedAt)
				}
				continue
			}
			if at == nil {
				at = make(map[dedupe.Key]int, n)
				for _, i := range st.order {
					at[reqs[i].Key] = i
				}
			}
			i, ok := at[kr.rec.Key]
			if !ok || found[kr.rec.Key] {
				continue
			}
			found[kr.rec.Key] = true
			if kr.inserted {
				out[i].Claim = s.insertedClaim(reqs[i], kr.rec.CreatedAt)
				continue
			}
			s.decide(&out[i], reqs[i], kr.rec, kr.now)
		}
		return rows.Err()
	}
	var restart bool // the transaction tried the keys as new, and is to be rolled back
	if n > 0 && begin && st.insert != "" && !s.batchFoundStored.Load() {
		// The transaction is DoBatch's own and nothing went before: insert
		// every key as new, learning only how many were. When all were,
		// that is the whole answer; otherwise roll back and claim them all
		// with the statement that answers each stored key, as the next
		// batches do until one inserts all its keys.
		inserted, now, err := insertNew(ctx, tx, s.beginSQL, st.insert, st.insertArgs)
		if err != nil {
			return s.l.layoutError(op, err)
		}
		if inserted == int64(n) {
			for _, i := range st.order {
				found[reqs[i].Key] = true
				out[i].Claim = s.insertedClaim(reqs[i], now)
			}
			n = 0 // claimed
		}
		begin, restart = false, n > 0
		if restart {
			s.batchFoundStored.Store(true)
		}
	}
	var pre []string
	switch {
	case restart:
		pre = []string{"rollback", s.beginSQL}
	case begin:
		pre = []string{s.beginSQL}
	}
	if n > 0 {
		if err := s.queryIn(ctx, tx, pre, st.claim, st.claimArgs, read); err != nil {
			return s.l.layoutError(op, err)
		}
	} else if begin {
		if _, err := tx.Exec(ctx, s.beginSQL); err != nil {
			return classify("begin", err)
		}
	}
	// The keys that conflicted with a row that the claim's snapshot did not
	// show: a transaction it waited for committed them. Read them locked.
	var locks []int
	for j, i := range st.order {
		if !found[reqs[i].Key] {
			locks = append(locks, j)
		}
	}
	if len(locks) > 0 {
		if err := s.queryIn(ctx, tx, nil, st.lock, st.lockArgs(locks), read); err != nil {
			return classify(op, err)
		}
	}
	// What is left needs the one-key protocol: expired leases to take over
	// (fenced, so a race with another worker is decided again), keys that
	// cleanup deleted between the two statements, and the keys that the
	// partitioned layout finds live in the legacy table.
	for _, i := range st.order {
		if c := &out[i]; !found[reqs[i].Key] || (c.Err == nil && c.Decision == dedupe.DecisionTakeover) {
			alone = append(alone, i)
		}
	}
	slices.SortFunc(alone, byKey(reqs))
	for _, i := range alone {
		c := &out[i]
		claim, err := s.claim(ctx, tx, reqs[i], dedupe.StatusCompleted, 0)
		switch {
		case err == nil:
			c.Claim, c.Err = claim, nil
		case isPerRequest(err):
			c.Claim, c.Err = dedupe.Claim{}, err
		default:
			return err
		}
	}
	return nil
}

// insertedClaim is the claim of a key that a batch statement inserted at
// now: COMPLETED, expiring after its TTL (in whole microseconds, as the
// statement adds it).
func (s *Store) insertedClaim(req dedupe.Request, now time.Time) dedupe.Claim {
	return dedupe.Claim{Decision: dedupe.DecisionNew, TTL: req.TTL, Record: dedupe.Record{
		Key: req.Key, Fingerprint: req.Fingerprint, Status: dedupe.StatusCompleted, Attempts: 1, Source: req.Source,
		CreatedAt: now, CompletedAt: now, ExpiresAt: now.Add(s.ttl(req).Truncate(time.Microsecond)),
	}}
}

// batchStmts are a batch claim's statements for the store's layout: claim
// inserts the keys of reqs at order (sorted, distinct) and answers the
// rows of those that conflicted, when its snapshot shows them; lock reads
// the keys at order[j] for j in js, locked, in the same order; insert,
// when set, inserts them and answers only how many it did.
type batchStmts struct {
	order     []int
	claim     string
	claimArgs []any
	lock      string
	lockArgs  func(js []int) []any
	// insert, when not "", inserts the keys as new and answers no row: its
	// command tag says how many it inserted, and their created_at is read
	// after it (p2BatchInsertSQL, insertNew). It is tried first when it
	// would be the transaction's first statement.
	insert     string
	insertArgs []any
}

// insertNew sends, in one round trip, BEGIN, the statement that inserts a
// batch's keys as new (p2BatchInsertSQL) and the read of the
// transaction's time; it returns how many keys were inserted, and that
// time.
func insertNew(ctx context.Context, tx pgx.Tx, begin, insert string, args []any) (n int64, now time.Time, err error) {
	b := &pgx.Batch{}
	b.Queue(begin)
	b.Queue(insert, args...)
	b.Queue(batchNowSQL)
	br := tx.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err = br.Exec(); err != nil { // the insert is prepared first: an error of its own may come here
		return 0, time.Time{}, err
	}
	tag, err := br.Exec()
	if err != nil {
		return 0, time.Time{}, err
	}
	if err = br.QueryRow().Scan(&now); err != nil {
		return 0, time.Time{}, err
	}
	return tag.RowsAffected(), now, nil
}

// queryIn runs stmt with args in tx and hands its rows to read, which
// scans them all; the statements of pre (tx's BEGIN, say) go first, in
// the same round trip.
func (s *Store) queryIn(ctx context.Context, tx pgx.Tx, pre []string, stmt string, args []any, read func(pgx.Rows) error) error {
	if len(pre) == 0 {
		rows, err := tx.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		return read(rows)
	}
	b := &pgx.Batch{}
	for _, p := range pre {
		b.Queue(p)
	}
	b.Queue(stmt, args...)
	br := tx.SendBatch(ctx, b)
	var err error
	for range pre {
		if _, err = br.Exec(); err != nil { // stmt is prepared first: an error of its own may come here
			break
		}
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = read(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// byKey orders indexes of reqs by key, in "C" collation: the order in
// which a batch claims its keys.
func byKey(reqs []dedupe.Request) func(a, b int) int {
	return func(a, b int) int {
		return cmp.Or(strings.Compare(reqs[a].Key.Scope, reqs[b].Key.Scope), strings.Compare(reqs[a].Key.ID, reqs[b].Key.ID))
	}
}

// allInserted is the one row that answers a batch claim statement (of
// either layout) whose every key was inserted: no key (an invalid one) and
// the statement's time, now(), which every inserted row got as created_at
// and completed_at.
const allInserted = `SELECT true, ''::text, ''::text, ''::text, 'COMPLETED'::text, NULL::bytea, 1, NULL::text, NULL::int, NULL::bigint,
       now(), now(), NULL::timestamptz, now(), clock_timestamp()`

// beginFirst is the statements that go before a transaction's first one:
// its BEGIN when it is still to be sent.
func beginFirst(s *Store, begin bool) []string {
	if begin {
		return []string{s.beginSQL}
	}
	return nil
}

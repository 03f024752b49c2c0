package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/pgtx"
)

// BatchFunc is the work that DoBatch runs once for a batch, in the
// transaction that holds the batch's claims. fresh lists the indexes (into
// DoBatch's reqs, ascending) of the requests whose handler must run: the
// new keys and the expired leases taken over. It returns nil, or one result
// per fresh request (results[i] for reqs[fresh[i]]; nil stores nothing),
// stored with the keys for their duplicates.
type BatchFunc func(ctx context.Context, tx pgx.Tx, fresh []int) (results [][]byte, err error)

type batchClaimsKey struct{}

// BatchClaimsFromContext returns, in the ctx that DoBatch hands its
// BatchFunc, the batch's claims as decided before fn runs: one per request,
// in reqs' order (read them, do not change them). fn can tell from them why
// a request is not fresh (a duplicate, a key reuse, a key in flight).
func BatchClaimsFromContext(ctx context.Context) ([]BatchClaim, bool) {
	claims, ok := ctx.Value(batchClaimsKey{}).([]BatchClaim)
	return claims, ok
}

// BatchClaim is DoBatch's answer for one request.
type BatchClaim struct {
	// Claim is the claim's decision and the key's record: OutcomeNew or
	// OutcomeTakeover when fn ran for it (Record.Result is then fn's
	// result), DecisionDuplicate with the stored result otherwise. Zero when
	// Err is set.
	dedupe.Claim
	// Err is the request's own failure, which neither ran fn for it nor
	// failed the batch: an *dedupe.InvalidKeyError, a *dedupe.KeyReusedError
	// (permanent: for the dead-letter topic) or a *dedupe.InFlightError (a
	// lease-mode claim holds the key: try again later).
	Err error
}

// DoBatch is Do for many keys in one transaction: it begins a transaction,
// claims every valid key of reqs in one statement (the keys that conflict
// with stored ones are then read in one more, waiting for any transaction
// that holds them), decides each with [dedupe.Decide], runs fn once with the
// transaction and the indexes of the fresh requests (none: fn does not run),
// stores fn's results in one statement and commits. The answer has one
// BatchClaim per request, in reqs' order.
//
// Duplicates carry their stored result; key reuses, invalid keys and keys
// in flight carry their error in BatchClaim.Err and are not handed to fn.
// A key that appears more than once in reqs is claimed by its first
// occurrence; the later ones are decided against it as if it had been
// stored before them: duplicates of it with its result when their
// fingerprint is the same, key reuses when it differs.
//
// Keys are claimed in (scope, id) order, so concurrent batches over
// overlapping keys wait for each other instead of deadlocking; a batch that
// waited on another's uncommitted key finds it completed (a duplicate) or,
// if that batch rolled back, claims it itself.
//
// An error from fn rolls everything back, every key included, and is
// returned as is with a nil answer: the next delivery runs fn again. A
// batch-wide failure (serialisation failure, deadlock, lost connection)
// retries the whole transaction as Do does, up to Config.MaxTxAttempts
// times. A COMMIT whose answer never arrived is settled as in Do: the keys
// found completed by the unanswered transaction itself keep their first
// decision.
func (s *Store) DoBatch(ctx context.Context, reqs []dedupe.Request, fn BatchFunc) ([]BatchClaim, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := s.prepareCodes(ctx, reqs); err != nil {
		return nil, err
	}
	wait := backoff.New(s.cfg.RetryBackoff, time.Second)
	var unanswered []BatchClaim // the answer of a transaction whose COMMIT got no answer
	for attempt := 1; ; attempt++ {
		out, committing, err := s.doBatchTx(ctx, reqs, fn)
		if err == nil && unanswered != nil {
			for i := range out {
				u := unanswered[i]
				if u.Err == nil && u.Decision.Run() && out[i].Err == nil && out[i].Decision == dedupe.DecisionDuplicate &&
					out[i].Record.CompletedAt.Equal(u.Record.CompletedAt) && out[i].Record.Fingerprint == reqs[i].Fingerprint {
					out[i].Decision = u.Decision // our own write, committed after all
				}
			}
		}
		ambiguous := committing && !isServerError(err)
		if ambiguous {
			unanswered = out
		}
		if err == nil || (!ambiguous && !retryTx(err)) || attempt >= s.cfg.MaxTxAttempts {
			if err != nil {
				return nil, err
			}
			return out, nil
		}
		s.cfg.Logger.DebugContext(ctx, "pgstore: retrying batch transaction", "keys", len(reqs), "attempt", attempt, "err", err)
		if err := wait.SleepJittered(ctx); err != nil {
			return nil, err
		}
	}
}

// doBatchTx is one attempt of DoBatch; committing reports that err came
// from the COMMIT itself (out is then the answer that was committing).
func (s *Store) doBatchTx(ctx context.Context, reqs []dedupe.Request, fn BatchFunc) (out []BatchClaim, committing bool, err error) {
	// The layout's state is read before the connection is taken (and again
	// on it, should it go stale meanwhile); BEGIN goes in one round trip
	// with the claim statement.
	if s.part != nil {
		if _, err := s.part.layoutState(ctx, s.pool); err != nil {
			return nil, false, err
		}
	}
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, classify("begin", err)
	}
	tx := &connTx{pc: pc, conn: pc.Conn()}
	defer pgtx.Rollback(ctx, tx)
	out, err = s.claimBatchTx(ctx, tx, reqs, true)
	if err != nil {
		return nil, false, err
	}
	var fresh []int
	for i, c := range out {
		if c.Err == nil && c.Decision.Run() {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) > 0 {
		results, err := fn(context.WithValue(ctx, batchClaimsKey{}, out), tx, fresh)
		if err != nil {
			return nil, false, err
		}
		if results != nil && len(results) != len(fresh) {
			return nil, false, fmt.Errorf("pgstore: DoBatch: fn returned %d results for %d fresh requests: return nil or one per fresh request",
				len(results), len(fresh))
		}
		if err := s.CompleteBatchTx(ctx, tx, out, fresh, results); err != nil {
			return nil, false, err
		}
		// Later copies of a fresh key are duplicates of it: they get its result.
		ran := make(map[dedupe.Key]int, len(fresh))
		for _, i := range fresh {
			ran[reqs[i].Key] = i
		}
		for i := range out {
			if f, ok := ran[reqs[i].Key]; ok && f != i && out[i].Err == nil && out[i].Decision == dedupe.DecisionDuplicate {
				out[i].Record.Result = out[f].Record.Result
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, true, classify(fmt.Sprintf("commit a batch of %d keys", len(reqs)), err)
	}
	return out, false, nil
}

// ClaimBatchTx claims every key of reqs in the caller's transaction, as
// DoBatch does, and returns one BatchClaim per request: run the handler in
// tx for those whose Outcome.Run() and whose Err is nil, then
// CompleteBatchTx and commit. Keys are written COMPLETED at once, as by
// ClaimTx.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request) ([]BatchClaim, error) {
	if tx == nil {
		return nil, errors.New("pgstore: ClaimBatchTx: tx is nil")
	}
	return s.claimBatchTx(ctx, tx, reqs, false)
}

// claimBatchTx is ClaimBatchTx; with begin, tx is a connTx whose
// BEGIN is still to be sent, with the claim statement.
func (s *Store) claimBatchTx(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, begin bool) ([]BatchClaim, error) {
	out := make([]BatchClaim, len(reqs))
	// first maps a key to the index of its first valid request; order lists
	// those indexes sorted by key, the order in which keys are claimed.
	first := make(map[dedupe.Key]int, len(reqs))
	order := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		if _, seen := first[r.Key]; !seen {
			first[r.Key] = i
			order = append(order, i)
		}
	}
	slices.SortFunc(order, byKey(reqs))
	if len(order) > 0 {
		if err := s.claimBatch(ctx, tx, reqs, order, out, begin); err != nil {
			return nil, err
		}
	} else if begin {
		if _, err := tx.Exec(ctx, s.beginSQL); err != nil {
			return nil, classify("begin", err)
		}
	}
	// Later copies of a key are decided against its first request, as if
	// that one had been stored before them.
	for i, r := range reqs {
		f, ok := first[r.Key]
		if !ok || f == i || out[i].Err != nil {
			continue
		}
		rec, err := batchRecord(out[f], reqs[f])
		if err != nil {
			out[i].Err = err // in flight, like its first copy
			continue
		}
		decision, err := dedupe.Decide(rec, r.Fingerprint, rec.CompletedAt)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Claim = dedupe.Claim{Decision: decision, Record: rec, TTL: r.TTL}
	}
	return out, nil
}

// ErrClaimAlone is the Err of a later copy of a key in a batch whose first
// copy could not be claimed (it reused the key with another payload, say):
// what the later copy gets depends on the stored key alone (a duplicate
// with its stored result, a takeover of an expired lease, in flight, a key
// reuse), so claim it on its own, with Store.Do, after the batch. Nothing
// was written for it.
var ErrClaimAlone = errors.New("pgstore: an earlier copy of this key in the batch could not be claimed: claim this request on its own")

// batchRecord is the record that a later copy of a key is decided
// against: the one its first request is writing. When the first request
// could not be claimed, the later copy is not decided here: in flight like
// the first, or ErrClaimAlone.
func batchRecord(c BatchClaim, req dedupe.Request) (dedupe.Record, error) {
	var inflight *dedupe.InFlightError
	switch {
	case errors.As(c.Err, &inflight):
		return dedupe.Record{}, c.Err
	case c.Err != nil:
		return dedupe.Record{}, ErrClaimAlone
	}
	return c.Record, nil
}

// claimBatch claims the keys of reqs at order (sorted, distinct, valid)
// and writes their answers into out.
func (s *Store) claimBatch(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, order []int, out []BatchClaim, begin bool) error {
	var (
		st    batchStmts
		alone []int // requests claimed one at a time after the batch statement
		err   error
	)
	if s.part != nil {
		if st, alone, begin, err = s.partBatchStmts(ctx, tx, reqs, order, out, begin); err != nil {
			return err
		}
	} else {
		st = s.legacyBatchStmts(reqs, order)
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
	if n > 0 {
		if err := s.queryIn(ctx, tx, begin, st.claim, st.claimArgs, read); err != nil {
			return s.layoutError(op, err)
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
		if err := s.queryIn(ctx, tx, false, st.lock, st.lockArgs(locks), read); err != nil {
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
// the keys at order[j] for j in js, locked, in the same order.
type batchStmts struct {
	order     []int
	claim     string
	claimArgs []any
	lock      string
	lockArgs  func(js []int) []any
}

// legacyBatchStmts are the legacy layout's batch statements.
func (s *Store) legacyBatchStmts(reqs []dedupe.Request, order []int) batchStmts {
	n := len(order)
	scopes, ids, fps := make([]string, n), make([]string, n), make([]string, n)
	topics, parts, offsets, ttls := make([]*string, n), make([]*int32, n), make([]*int64, n), make([]float64, n)
	for j, i := range order {
		r := reqs[i]
		scopes[j], ids[j], fps[j], ttls[j] = r.Key.Scope, r.Key.ID, string(r.Fingerprint), micros(s.ttl(r))
		if r.Source != (dedupe.Source{}) {
			src := r.Source
			topics[j], parts[j], offsets[j] = &src.Topic, &src.Partition, &src.Offset
		}
	}
	return batchStmts{
		order: order,
		claim: s.sql(batchClaimSQL), claimArgs: []any{scopes, ids, fps, topics, parts, offsets, ttls, n},
		lock: s.sql(batchLockSQL),
		lockArgs: func(js []int) []any {
			ls, li := make([]string, len(js)), make([]string, len(js))
			for k, j := range js {
				ls[k], li[k] = scopes[j], ids[j]
			}
			return []any{ls, li}
		},
	}
}

// partBatchStmts are the partitioned layout's batch statements, for the
// keys of order that it claims together: a key whose ID was minted beyond
// the partitions created ahead gets its InvalidKeyError in out, and, while
// the legacy table serves as the oldest generation, the keys live there
// are returned in alone, to be claimed one at a time where they are (the
// read that finds them goes in the transaction, so begin is then false).
func (s *Store) partBatchStmts(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, order []int, out []BatchClaim,
	begin bool) (st batchStmts, alone []int, stillBegin bool, err error) {
	args := make([]claimArgs, 0, len(order))
	kept := make([]int, 0, len(order))
	legacy := ""
	for _, i := range order {
		a, err := s.newClaimArgs(ctx, tx, reqs[i], dedupe.StatusCompleted, 0)
		if err != nil {
			if isPerRequest(err) {
				out[i].Err = err
				continue
			}
			return batchStmts{}, nil, begin, err
		}
		if a.part.legacy != "" {
			legacy = a.part.legacy
		}
		args, kept = append(args, a), append(kept, i)
	}
	if legacy != "" && len(kept) > 0 {
		live, err := s.legacyLive(ctx, tx, legacy, reqs, kept, begin)
		if err != nil {
			return batchStmts{}, nil, begin, err
		}
		begin = false
		j := 0
		for k, i := range kept {
			if live[reqs[i].Key] {
				alone = append(alone, i)
				continue
			}
			kept[j], args[j] = i, args[k]
			j++
		}
		kept, args = kept[:j], args[:j]
	}
	n := len(kept)
	// The keys go in the order of the partitioned table's primary key, so
	// that concurrent batches lock them in one order.
	idx := make([]int, n)
	for j := range idx {
		idx[j] = j
	}
	slices.SortFunc(idx, func(a, b int) int {
		pa, pb := args[a].part, args[b].part
		return cmp.Or(cmp.Compare(pa.scopeCode, pb.scopeCode), bytes.Compare(pa.sid.kid[:], pb.sid.kid[:]), cmp.Compare(pa.sid.kind, pb.sid.kind))
	})
	var (
		scopes, ids, kinds = make([]string, n), make([]string, n), make([]string, n)
		scodes, topics     = make([]int16, n), make([]*int16, n)
		kids               = make([][16]byte, n)
		texts              = make([]*string, n)
		fps                = make([][]byte, n)
		parts, offsets     = make([]*int32, n), make([]*int64, n)
		ttls               = make([]float64, n)
	)
	st.order = make([]int, n)
	for j, k := range idx {
		a := &args[k]
		st.order[j] = kept[k]
		scopes[j], ids[j], scodes[j], kids[j], kinds[j], texts[j] = a.scope, a.id, a.part.scopeCode, a.part.sid.kid, string(a.part.sid.kind), a.part.sid.text
		fps[j], topics[j], parts[j], offsets[j], ttls[j] = a.part.fp, a.part.topicCode, a.partition, a.offset, a.ttlMicros
	}
	st.claim, st.lock = s.part.batchClaim, s.part.batchLock
	st.claimArgs = []any{scopes, ids, scodes, kids, kinds, texts, fps, topics, parts, offsets, ttls, n}
	st.lockArgs = func(js []int) []any {
		ls, li, lc, lk, lt, lx := make([]string, len(js)), make([]string, len(js)), make([]int16, len(js)), make([][16]byte, len(js)), make([]string, len(js)), make([]*string, len(js))
		for m, j := range js {
			ls[m], li[m], lc[m], lk[m], lt[m], lx[m] = scopes[j], ids[j], scodes[j], kids[j], kinds[j], texts[j]
		}
		return []any{ls, li, lc, lk, lt, lx}
	}
	return st, alone, begin, nil
}

// legacyLive reads, in the transaction (sending its BEGIN first when
// begin), which keys of reqs at kept are live in the legacy table.
func (s *Store) legacyLive(ctx context.Context, tx pgx.Tx, legacy string, reqs []dedupe.Request, kept []int, begin bool) (map[dedupe.Key]bool, error) {
	scopes, ids := make([]string, len(kept)), make([]string, len(kept))
	for j, i := range kept {
		scopes[j], ids[j] = reqs[i].Key.Scope, reqs[i].Key.ID
	}
	live := make(map[dedupe.Key]bool)
	err := s.queryIn(ctx, tx, begin, strings.ReplaceAll(p2BatchLegacySQL, "{L}", legacy), []any{scopes, ids}, func(rows pgx.Rows) error {
		for rows.Next() {
			var k dedupe.Key
			if err := rows.Scan(&k.Scope, &k.ID); err != nil {
				rows.Close()
				return err
			}
			live[k] = true
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.layoutError("read the legacy keys of a batch", err)
	}
	return live, nil
}

// queryIn runs stmt with args in tx and hands its rows to read, which
// scans them all; with begin, tx's BEGIN goes in the same round trip.
func (s *Store) queryIn(ctx context.Context, tx pgx.Tx, begin bool, stmt string, args []any, read func(pgx.Rows) error) error {
	if !begin {
		rows, err := tx.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		return read(rows)
	}
	b := &pgx.Batch{}
	b.Queue(s.beginSQL)
	b.Queue(stmt, args...)
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec() // stmt is prepared first: an error of its own may come here
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

// layoutError classifies the error of a statement built from the
// partitioned layout's state: a key with no partition to go to, or a
// table gone, makes the transaction retry once the state has been read
// again.
func (s *Store) layoutError(op string, err error) error {
	if s.part != nil && layoutChanged(err) {
		s.part.forget()
		return dedupe.Retryable(fmt.Errorf("pgstore: %s: the tables of %s changed under the transaction (a partition retired, "+
			"the legacy table dropped), or Cleanup (which creates the partitions ahead) has not run for a while: %w", op, s.part.parent, err))
	}
	return classify(op, err)
}

// prepareCodes reads (or adds) the codes of the scopes and topics of reqs
// before a transaction holds a connection (the partitioned layout).
func (s *Store) prepareCodes(ctx context.Context, reqs []dedupe.Request) error {
	if s.part == nil {
		return nil
	}
	for _, r := range reqs {
		if _, err := s.part.code(ctx, s.pool, r.Key.Scope); err != nil {
			return err
		}
		if r.Source.Topic != "" {
			if _, err := s.part.code(ctx, s.pool, r.Source.Topic); err != nil {
				return err
			}
		}
	}
	return nil
}

// decide applies the decision table to a conflicting row; a takeover is
// only marked here (claimBatch carries it out).
func (s *Store) decide(c *BatchClaim, req dedupe.Request, rec dedupe.Record, now time.Time) {
	decision, err := dedupe.Decide(rec, req.Fingerprint, now)
	if err != nil {
		c.Err = err
		return
	}
	c.Claim = dedupe.Claim{Decision: decision, Record: rec, TTL: req.TTL}
}

// isPerRequest reports whether a claim's error belongs to its request
// rather than to the batch.
func isPerRequest(err error) bool {
	return errors.Is(err, dedupe.ErrKeyReused) || errors.Is(err, dedupe.ErrInFlight) || errors.Is(err, dedupe.ErrInvalidKey)
}

// CompleteBatchTx stores the results of the fresh claims of a batch
// (claims[fresh[i]] gets results[i]) in one statement; nil results, or a
// nil slice, cost nothing, since the keys were written COMPLETED when they
// were claimed. On return, each fresh claim's Record.Result is its result.
func (s *Store) CompleteBatchTx(ctx context.Context, tx pgx.Tx, claims []BatchClaim, fresh []int, results [][]byte) error {
	if results == nil {
		return nil
	}
	if len(results) != len(fresh) {
		return fmt.Errorf("pgstore: CompleteBatchTx: %d results for %d fresh claims", len(results), len(fresh))
	}
	var scopes, ids []string
	var blobs [][]byte
	for j, i := range fresh {
		c := &claims[i]
		if c.Err != nil || !c.Decision.Run() {
			return fmt.Errorf("pgstore: CompleteBatchTx of %s: the claim's decision is %v, not one that runs the handler", c.Record.Key, c.Decision)
		}
		if results[j] == nil {
			continue
		}
		if err := s.checkResult(results[j]); err != nil {
			return fmt.Errorf("pgstore: result of %s: %w", c.Record.Key, err)
		}
		scopes, ids, blobs = append(scopes, c.Record.Key.Scope), append(ids, c.Record.Key.ID), append(blobs, results[j])
	}
	if len(ids) > 0 && s.part != nil {
		for j := range ids {
			key := dedupe.Key{Scope: scopes[j], ID: ids[j]}
			n, err := s.update(ctx, tx, key, func(q *queries) string { return q.result }, nil, pgx.NamedArgs{"result": blobs[j]})
			if err != nil {
				return classify("complete "+key.String(), err)
			}
			if n != 1 {
				return fmt.Errorf("pgstore: complete a batch: %s was not claimed in this transaction", key)
			}
		}
	} else if len(ids) > 0 {
		tag, err := tx.Exec(ctx, s.sql(batchResultSQL), scopes, ids, blobs)
		if err != nil {
			return classify(fmt.Sprintf("complete a batch of %d keys", len(ids)), err)
		}
		if tag.RowsAffected() != int64(len(ids)) {
			return fmt.Errorf("pgstore: complete a batch: %d of %d keys were not claimed in this transaction", int64(len(ids))-tag.RowsAffected(), len(ids))
		}
	}
	for j, i := range fresh {
		claims[i].Record.Result = results[j]
	}
	return nil
}

// sql returns one of the batch statements for the store's table.
func (s *Store) sql(stmt string) string { return strings.ReplaceAll(stmt, "{T}", s.table) }

// The batch statements, with {T} standing for the schema-qualified table.
const (
	// batchClaimSQL inserts every key from arrays, sorted by key. When it
	// inserted them all (the usual case) it answers one row, allInserted;
	// otherwise it answers the rows it inserted and the stored rows of those
	// that conflicted, when its snapshot shows them: the multi-key claimSQL.
	// $8 is the number of keys.
	batchClaimSQL = `WITH ins AS (
    INSERT INTO {T} AS k (scope, key, fingerprint, status, attempts, source_topic, source_partition,
                        source_offset, created_at, completed_at, locked_until, expires_at)
    SELECT u.scope, u.key, u.fp, 'COMPLETED', 1, u.topic, u.part, u.off, now(), now(), NULL,
           now() + u.ttl * interval '1 microsecond'
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::float8[])
         AS u(scope, key, fp, topic, part, off, ttl)
    ORDER BY u.scope COLLATE "C", u.key COLLATE "C"
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING ` + insertedCols + `
), n AS (SELECT count(*) AS n FROM ins)
` + allInserted + ` WHERE (SELECT n FROM n) = $8::int
UNION ALL
SELECT true, *, clock_timestamp() FROM ins WHERE (SELECT n FROM n) < $8::int
UNION ALL
SELECT false, ` + prefixedCols + `, clock_timestamp()
FROM {T} k JOIN unnest($1::text[], $2::text[]) AS u(scope, key) ON k.scope = u.scope AND k.key = u.key
WHERE (SELECT n FROM n) < $8::int`

	// allInserted is the one row that answers a batch claim whose every key
	// was inserted: no key (an invalid one) and the statement's time, now(),
	// which every inserted row got as created_at and completed_at.
	allInserted = `SELECT true, ''::text, ''::text, ''::text, 'COMPLETED'::text, NULL::bytea, 1, NULL::text, NULL::int, NULL::bigint,
       now(), now(), NULL::timestamptz, now(), clock_timestamp()`

	// batchLockSQL reads conflicting rows that batchClaimSQL's snapshot
	// did not show, locked, in key order.
	batchLockSQL = `SELECT false, ` + prefixedCols + `, clock_timestamp()
FROM {T} k JOIN unnest($1::text[], $2::text[]) AS u(scope, key) ON k.scope = u.scope AND k.key = u.key
ORDER BY k.scope COLLATE "C", k.key COLLATE "C"
FOR UPDATE OF k`

	// batchResultSQL stores the results of keys claimed in the same transaction.
	batchResultSQL = `UPDATE {T} AS k SET result = u.result
FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u(scope, key, result)
WHERE k.scope = u.scope AND k.key = u.key AND k.status = 'COMPLETED'`

	// insertedCols reads a row that the statement inserted in the
	// columns of cols, leaving out what the request already holds (its
	// fingerprint and source): claimBatch makes its claim from the request
	// and the row's created_at (insertedClaim).
	insertedCols = `k.scope, k.key, ''::text, k.status, NULL::bytea, k.attempts, NULL::text, NULL::int, NULL::bigint,
       k.created_at, k.completed_at, k.locked_until, k.expires_at`

	prefixedCols = `k.scope, k.key, k.fingerprint, k.status, k.result, k.attempts, k.source_topic, k.source_partition,
       k.source_offset, k.created_at, k.completed_at, k.locked_until, k.expires_at`
)

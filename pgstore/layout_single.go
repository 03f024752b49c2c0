package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/pgerr"
)

// singleTable is LayoutSingleTable: every key in one table, its statements in
// layout_single_sql.go, their arguments positional.
type singleTable struct {
	s            *Store
	schema, name string // unquoted
	table        string // schema-qualified and quoted
	q            queries
	// The batch and stats statements on the table.
	batchClaim, batchLock, batchResult   string
	statsSize, statsExact, statsEstimate string
}

var _ layout = (*singleTable)(nil)

func newSingleTable(s *Store, schema, name string) *singleTable {
	table := pgx.Identifier{schema, name}.Sanitize()
	r := strings.NewReplacer("{T}", table)
	return &singleTable{s: s, schema: schema, name: name, table: table,
		q: queries{
			claim: r.Replace(claimSQL), claimNew: r.Replace(claimNewSQL), lock: r.Replace(lockSQL), takeover: r.Replace(takeoverSQL),
			result: r.Replace(resultSQL), complete: r.Replace(completeSQL), release: r.Replace(releaseSQL), extend: r.Replace(extendSQL),
			get: r.Replace(getSQL), cleanup: r.Replace(cleanupSQL),
			resultOne: oneRowSQL("WITH n AS (" + r.Replace(resultSQL) + " RETURNING 1)\nSELECT (SELECT count(*) FROM n)"),
		},
		batchClaim: r.Replace(batchClaimSQL), batchLock: r.Replace(batchLockSQL), batchResult: r.Replace(batchResultSQL),
		statsSize: r.Replace(statsSizeSQL), statsExact: r.Replace(statsExactSQL), statsEstimate: r.Replace(statsEstimateSQL),
	}
}

func (l *singleTable) prepareClaim(_ context.Context, _ DBTX, _ dedupe.Request, a claimArgs) (claimArgs, error) {
	a.q = &l.q
	return a, nil
}

func (l *singleTable) claimParams(a claimArgs) []any {
	return []any{a.scope, a.id, a.fingerprint, string(a.status), a.topic, a.partition, a.offset, a.leaseMicros, a.ttlMicros}
}

func (l *singleTable) lockParams(a claimArgs) []any { return []any{a.scope, a.id} }

func (l *singleTable) takeoverParams(a claimArgs, attempts int) []any {
	return []any{a.scope, a.id, attempts, string(a.status), a.topic, a.partition, a.offset, a.leaseMicros, a.ttlMicros}
}

func (l *singleTable) claimError(req dedupe.Request, _ claimArgs, err error) error {
	return classify("claim "+req.Key.String(), err)
}

func (l *singleTable) prepareBatch(context.Context, []dedupe.Request) error { return nil }

func (l *singleTable) beforeBatchTx(context.Context) error { return nil }

func (l *singleTable) batchStmts(_ context.Context, _ pgx.Tx, reqs []dedupe.Request, order []int, _ []BatchClaim,
	begin bool) (batchStmts, []int, bool, error) {
	n := len(order)
	scopes, ids, fps := make([]string, n), make([]string, n), make([]string, n)
	topics, parts, offsets, ttls := make([]*string, n), make([]*int32, n), make([]*int64, n), make([]float64, n)
	for j, i := range order {
		r := reqs[i]
		scopes[j], ids[j], fps[j], ttls[j] = r.Key.Scope, r.Key.ID, string(r.Fingerprint), micros(l.s.ttl(r))
		if r.Source != (dedupe.Source{}) {
			src := r.Source
			topics[j], parts[j], offsets[j] = &src.Topic, &src.Partition, &src.Offset
		}
	}
	return batchStmts{
		order: order,
		claim: l.batchClaim, claimArgs: []any{scopes, ids, fps, topics, parts, offsets, ttls, n},
		lock: l.batchLock,
		lockArgs: func(js []int) []any {
			ls, li := make([]string, len(js)), make([]string, len(js))
			for k, j := range js {
				ls[k], li[k] = scopes[j], ids[j]
			}
			return []any{ls, li}
		},
	}, nil, begin, nil
}

func (l *singleTable) storeResults(ctx context.Context, tx pgx.Tx, scopes, ids []string, blobs [][]byte) (int64, error) {
	tag, err := tx.Exec(ctx, l.batchResult, scopes, ids, blobs)
	if err != nil {
		return 0, classify(fmt.Sprintf("complete a batch of %d keys", len(ids)), err)
	}
	return tag.RowsAffected(), nil
}

func (l *singleTable) layoutError(op string, err error) error { return classify(op, err) }

func (l *singleTable) update(ctx context.Context, db DBTX, key dedupe.Key, u keyUpdate) (int64, error) {
	var stmt string
	var args []any
	switch u.op {
	case updateResult:
		stmt, args = l.q.result, []any{key.Scope, key.ID, u.result}
	case updateComplete:
		stmt, args = l.q.complete, []any{key.Scope, key.ID, u.attempts, u.result, u.ttlMicros}
	case updateRelease:
		stmt, args = l.q.release, []any{key.Scope, key.ID, u.attempts}
	case updateExtend:
		stmt, args = l.q.extend, []any{key.Scope, key.ID, u.attempts, u.leaseMicros}
	}
	tag, err := db.Exec(ctx, stmt, args...)
	if pgerr.IsSingleTableRetired(err) {
		// The partitioned layout's clean-up retired the table: the key had
		// expired, and its lease with it.
		return 0, nil
	}
	return tag.RowsAffected(), err
}

func (l *singleTable) resultOne(_ context.Context, _ DBTX, key dedupe.Key, result []byte) (string, []any, error) {
	return l.q.resultOne, []any{key.Scope, key.ID, result}, nil
}

func (l *singleTable) get(ctx context.Context, db DBTX, key dedupe.Key) (keyRow, error) {
	return scanKeyRow(db.QueryRow(ctx, l.q.get, key.Scope, key.ID))
}

// stats counts the table's keys when there are up to statsExactMax of
// them, else estimates them from its statistics.
func (l *singleTable) stats(ctx context.Context, db DBTX) (dedupe.Stats, error) {
	var st dedupe.Stats
	var n int64
	if err := db.QueryRow(ctx, l.statsSize, statsExactMax+1).Scan(&n); err != nil {
		return st, classify("stats", err)
	}
	if n <= statsExactMax {
		var oldest *time.Time
		err := db.QueryRow(ctx, l.statsExact, l.table).Scan(&st.Processing, &st.Completed, &st.Expired, &oldest, &st.TableBytes)
		if err != nil {
			return st, classify("stats", err)
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
		return st, nil
	}
	var (
		tuples, processingShare, expiredShare float64
		relPages, pages, expired              int64
		oldest                                *time.Time
	)
	err := db.QueryRow(ctx, l.statsEstimate, l.table, l.schema, l.name, statsExactMax+1).
		Scan(&tuples, &relPages, &pages, &processingShare, &expired, &expiredShare, &oldest, &st.TableBytes)
	if err != nil {
		return st, classify("stats", err)
	}
	st.Estimated = true
	total := float64(n) // never analysed: at least what was counted
	if tuples > 0 && relPages > 0 {
		total = math.Max(total, tuples/float64(relPages)*float64(pages))
	} else if tuples > 0 {
		total = math.Max(total, tuples)
	}
	st.Processing = int64(math.Round(total * processingShare))
	st.Completed = int64(math.Round(total)) - st.Processing
	st.Expired = expired
	if expired > statsExactMax {
		st.Expired = max(expired, int64(math.Round(total*expiredShare)))
	}
	if oldest != nil {
		st.Oldest = *oldest
	}
	return st, nil
}

func (l *singleTable) cleanup(context.Context, *pgxpool.Conn) (int64, string, error) {
	return 0, l.q.cleanup, nil
}

// check checks the table's columns and refuses a store of this layout once
// the partitioned layout has started on the schema (ErrSingleTableClosed).
func (l *singleTable) check(ctx context.Context) error {
	pool := l.s.pool
	_, colsErr := pool.Exec(ctx, "SELECT "+cols+" FROM "+l.table+" LIMIT 0")
	if colsErr != nil && !IsConfigurationError(colsErr) {
		return classify("check "+l.table, colsErr)
	}
	// Once the partitioned layout started on the schema, this store may
	// not claim new keys (ErrSingleTableClosed): refused here, at start,
	// also once the clean-up dropped the table. A schema without the
	// partitioned layout's state has nothing to say.
	var started bool
	err := pool.QueryRow(ctx, "SELECT started_at IS NOT NULL FROM "+
		pgx.Identifier{l.schema, "exactly_keys2_state"}.Sanitize()).Scan(&started)
	switch {
	case err == nil && started:
		return fmt.Errorf("pgstore: check %s: %w", l.table, ErrSingleTableClosed)
	case colsErr != nil:
		return classify("check "+l.table, colsErr)
	case err != nil && !IsConfigurationError(err) && !errors.Is(err, pgx.ErrNoRows):
		return classify("check "+l.table, err)
	}
	return nil
}

func (l *singleTable) stateTable() string { return l.table }

func (l *singleTable) missingRights(maintenanceRights) []string { return nil }

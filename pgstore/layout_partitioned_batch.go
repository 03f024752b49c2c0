package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/exactly-go/exactly/dedupe"
)

// batchStmts are the batch statements for the keys of order that the
// layout claims together: a key whose ID was minted beyond the partitions
// created ahead gets its InvalidKeyError in out, and, while the legacy
// table serves as the oldest generation, the keys live there are returned
// in alone, to be claimed one at a time where they are (the read that
// finds them goes in the transaction, so begin is then false).
func (p *partitioned) batchStmts(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, order []int, out []BatchClaim,
	begin bool) (st batchStmts, alone []int, stillBegin bool, err error) {
	args := make([]claimArgs, 0, len(order))
	kept := make([]int, 0, len(order))
	legacy := ""
	for _, i := range order {
		a, err := p.s.validClaimArgs(ctx, tx, reqs[i], dedupe.StatusCompleted, 0, true) // claimBatchTx validated reqs
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
		live, err := p.legacyLive(ctx, tx, legacy, reqs, kept, begin)
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
		scodes             = make([]int16, n)
		kids               = make(pgtype.FlatArray[pgtype.UUID], n)
		texts              = make([]*string, n)
		fps                = make(pgtype.FlatArray[[]byte], n)
		topics             = make([]*int16, n)
		parts, offsets     = make([]*int32, n), make([]*int64, n)
		ttls               = make([]float64, n)
	)
	st.order = make([]int, n)
	for j, k := range idx {
		a := &args[k]
		st.order[j] = kept[k]
		scopes[j], ids[j], scodes[j], kids[j], kinds[j], texts[j] = a.scope, a.id, a.part.scopeCode, kidArg(a.part.sid.kid), string(a.part.sid.kind), a.part.sid.text
		fps[j], topics[j], parts[j], offsets[j], ttls[j] = a.part.fp, a.part.topicCode, a.partition, a.offset, a.ttlMicros
	}
	// The nullable columns go as arrays of plain values when no element is
	// NULL, and as a NULL array when every one is (unnest pads the rows with
	// NULL): pgx encodes both without reflection, and a NULL array costs
	// nothing to send.
	textsArg, topicsArg, partsArg, offsetsArg := nullableArg(texts), nullableArg(topics), nullableArg(parts), nullableArg(offsets)
	st.claim, st.lock = p.batchClaim, p.batchLock
	st.claimArgs = []any{scopes, ids, scodes, kids, kinds, textsArg, fps, topicsArg, partsArg, offsetsArg, ttls, n}
	if legacy == "" {
		// No read went before: the batch may try its keys as new first.
		st.insert, st.insertArgs = p.batchInsert, []any{scodes, kids, kinds, textsArg, fps, topicsArg, partsArg, offsetsArg, ttls}
	}
	st.lockArgs = func(js []int) []any {
		ls, li, lc, lk, lt, lx := make([]string, len(js)), make([]string, len(js)), make([]int16, len(js)), make(pgtype.FlatArray[pgtype.UUID], len(js)), make([]string, len(js)), make([]*string, len(js))
		for m, j := range js {
			ls[m], li[m], lc[m], lk[m], lt[m], lx[m] = scopes[j], ids[j], scodes[j], kids[j], kinds[j], texts[j]
		}
		return []any{ls, li, lc, lk, lt, nullableArg(lx)}
	}
	return st, alone, begin, nil
}

// nullableArg is the array argument of vs, a column that may hold NULL:
// a NULL array (typed nil) when every element is nil, the plain values
// when none is, else vs itself.
func nullableArg[T any](vs []*T) any {
	nils := 0
	for _, v := range vs {
		if v == nil {
			nils++
		}
	}
	switch {
	case nils == len(vs):
		return []T(nil)
	case nils > 0:
		return vs
	}
	plain := make([]T, len(vs))
	for i, v := range vs {
		plain[i] = *v
	}
	return plain
}

// legacyLive reads, in the transaction (sending its BEGIN first when
// begin), which keys of reqs at kept are live in the legacy table.
func (p *partitioned) legacyLive(ctx context.Context, tx pgx.Tx, legacy string, reqs []dedupe.Request, kept []int, begin bool) (map[dedupe.Key]bool, error) {
	scopes, ids := make([]string, len(kept)), make([]string, len(kept))
	for j, i := range kept {
		scopes[j], ids[j] = reqs[i].Key.Scope, reqs[i].Key.ID
	}
	live := make(map[dedupe.Key]bool)
	err := p.s.queryIn(ctx, tx, beginFirst(p.s, begin), strings.ReplaceAll(p2BatchLegacySQL, "{L}", legacy), []any{scopes, ids}, func(rows pgx.Rows) error {
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
		return nil, p.layoutError("read the legacy keys of a batch", err)
	}
	return live, nil
}

// storeResults stores the results in one statement: each key in its
// partition or, when it has no row there, in the legacy table.
func (p *partitioned) storeResults(ctx context.Context, tx pgx.Tx, scopes, ids []string, blobs [][]byte) (int64, error) {
	st, err := p.layoutState(ctx, tx)
	if err != nil {
		return 0, err
	}
	kids, kinds := make([]pgtype.UUID, len(ids)), make([]string, len(ids))
	for j, id := range ids {
		sid := encodeID(id, st.low)
		kids[j], kinds[j] = kidArg(sid.kid), string(sid.kind)
	}
	var n int64
	if err := tx.QueryRow(ctx, p.queriesFor(st, "").batchResult, scopes, ids, kids, kinds, blobs).Scan(&n); err != nil {
		return 0, p.layoutError(fmt.Sprintf("complete a batch of %d keys", len(ids)), err)
	}
	return n, nil
}

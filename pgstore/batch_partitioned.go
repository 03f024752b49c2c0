package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

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

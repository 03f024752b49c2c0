package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/pgstore"
)

// RetireScopeTx deletes the keys of one scope and no other, from the
// partitioned table and from the single table while it is still read (an
// upgraded deployment's), and on a store of the single table from it.
func TestRetireScopeTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, single, db := newPartitioned(t, nil, "")
	claim := func(st *pgstore.Store, scope string) dedupe.Key {
		t.Helper()
		req := dedupetest.Req(scope, uuid.NewString(), "p")
		if c, err := st.Do(ctx, req, noop); err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("claim in %s: %v %v", scope, c.Decision, err)
		}
		return req.Key
	}
	// A key of the single table, claimed before the partitioned layout
	// started: an upgraded deployment's, still read.
	old := claim(single, "rebuilt")
	startKeepingSingleTable(t, s, db)
	gone := []dedupe.Key{old, claim(s, "rebuilt"), claim(s, "rebuilt")}
	kept := []dedupe.Key{claim(s, "other")}
	retire := func(st *pgstore.Store, pool interface {
		Begin(context.Context) (pgx.Tx, error)
	}, scope string) int64 {
		t.Helper()
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			n, err = st.RetireScopeTx(ctx, tx, scope)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := retire(s, db.Pool, "rebuilt"); n != 3 {
		t.Errorf("partitioned: %d keys retired, want 3", n)
	}
	for _, k := range gone {
		if _, err := s.Get(ctx, k); !errors.Is(err, dedupe.ErrNotFound) {
			t.Errorf("%s after the retire: %v, want not found", k, err)
		}
	}
	for _, k := range kept {
		if _, err := s.Get(ctx, k); err != nil {
			t.Errorf("%s of another scope: %v", k, err)
		}
	}
	// A store of the single table, on a schema that never started the
	// partitioned layout.
	_, single2, db2 := newPartitioned(t, nil, "")
	k := claim(single2, "single")
	other := claim(single2, "other")
	if n := retire(single2, db2.Pool, "single"); n != 1 {
		t.Errorf("single table: %d keys retired, want 1", n)
	}
	if _, err := single2.Get(ctx, k); !errors.Is(err, dedupe.ErrNotFound) {
		t.Errorf("%s after the retire: %v, want not found", k, err)
	}
	if _, err := single2.Get(ctx, other); err != nil {
		t.Errorf("%s of another scope: %v", other, err)
	}
}

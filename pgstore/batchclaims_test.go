package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

// DoBatch's function finds the batch's claims in its context: why each
// request that is not fresh is not (a duplicate, a key in flight).
func TestDoBatchClaimsInContext(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, nil)
	ctx := context.Background()
	if _, err := s.DoBatch(ctx, reqsOf("s", "done"), func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	leased := reqsOf("s", "leased")[0]
	if _, err := s.Acquire(ctx, leased, time.Minute); err != nil {
		t.Fatal(err)
	}
	reqs := append(reqsOf("s", "done", "new"), leased)
	var got []pgstore.BatchClaim
	_, err := s.DoBatch(ctx, reqs, func(ctx context.Context, _ pgx.Tx, fresh []int) ([][]byte, error) {
		claims, ok := pgstore.BatchClaimsFromContext(ctx)
		if !ok {
			return nil, errors.New("no claims in the context")
		}
		got = append(got, claims...)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Decision != dedupe.DecisionDuplicate || got[1].Err != nil || !got[1].Decision.Run() ||
		!errors.Is(got[2].Err, dedupe.ErrInFlight) {
		t.Fatalf("claims %+v, want a duplicate, a new key and one in flight", got)
	}
	if _, ok := pgstore.BatchClaimsFromContext(ctx); ok {
		t.Fatal("claims in a context DoBatch did not hand out")
	}
}

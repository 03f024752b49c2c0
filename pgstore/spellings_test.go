package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// TestIDSpellingsAreKeysOfTheirOwn: a UUIDv7 in lower case, upper case and
// mixed case are three keys (an ID is compared as written), on both
// layouts, claimed in batches with copies of each and one at a time, three
// times over: each is applied once, none is taken for another.
func TestIDSpellingsAreKeysOfTheirOwn(t *testing.T) { eachLayout(t, testIDSpellings) }

func testIDSpellings(t *testing.T, newStore storeMaker) {
	s, db := newStore(t, nil)
	ctx := context.Background()
	// Its last two digits, random in a UUIDv7, are letters, so that the
	// three spellings differ.
	lower := uuid.Must(uuid.NewV7()).String()[:34] + "ba"
	upper, mixed := strings.ToUpper(lower), lower[:35]+"A"
	apply := "INSERT INTO " + db.Table("applied") + " (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = " + db.Table("applied") + ".n + 1"
	for range 3 {
		reqs := reqsOf("s", upper, lower, mixed, upper, lower)
		if _, err := s.DoBatch(ctx, reqs, applyBatch(db, reqs, nil)); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqsOf("s", upper, mixed, lower) {
			if _, err := s.Do(ctx, r, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := tx.Exec(ctx, apply, r.Key.ID)
				return nil, err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantApplied(t, db, map[string]int{lower: 1, upper: 1, mixed: 1})
	if ids, total, over := appliedCounts(t, db); ids != 3 || total != 3 || over != 0 {
		t.Errorf("applied: %d IDs, %d applications, %d IDs more than once; want 3, 3, 0", ids, total, over)
	}
}

package pgstore

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// v7Minted is a UUIDv7 minted at t.
func v7Minted(t time.Time) string {
	u := uuid.New()
	ms := uint64(t.UnixMilli())
	for i := 5; i >= 0; i-- {
		u[i] = byte(ms)
		ms >>= 8
	}
	u[6] = u[6]&0x0f | 0x70
	return u.String()
}

// Do and DoBatch decide a time-ordered key from the partitions that exist:
// a key whose partition another store created further ahead than this
// store's PartitionsAhead, or that this store's clock (behind the
// database's) puts beyond its own horizon, is claimed and applied by both;
// a key beyond every partition and beyond the horizon of the database's
// clock is an invalid key on both.
func TestHorizonFromThePartitions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	day := 24 * time.Hour
	newStore := func(ahead int) *Store {
		s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: LayoutPartitioned, PartitionsAhead: ahead, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	near, far := newStore(1), newStore(6)
	if err := near.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := far.Cleanup(ctx, nil); err != nil { // partitions until 7 days ahead
		t.Fatal(err)
	}
	behind := newStore(3)
	behind.part().now = func() time.Time { return time.Now().Add(-3 * day) }
	var dbNow time.Time
	if err := db.Pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	stored := func(r dedupe.Request) int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+near.part().parent+" WHERE kid = $1::uuid AND status = 'C'", r.Key.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		name   string
		s      *Store
		minted time.Time
	}{
		{"another store's partitions further ahead", near, dbNow.Add(4 * day)},
		{"the store's clock behind the database's", behind, dbNow.Add(2*day + 12*time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			one, batch := dedupetest.Req("s", v7Minted(tc.minted), "p"), dedupetest.Req("s", v7Minted(tc.minted), "p")
			if _, err := tc.s.Do(ctx, one, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
				t.Errorf("Do: %v", err)
			}
			out, err := tc.s.DoBatch(ctx, []dedupe.Request{batch}, func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil })
			if err != nil || out[0].Err != nil {
				t.Errorf("DoBatch: %v %+v", err, out)
			}
			if a, b := stored(one), stored(batch); a != 1 || b != 1 {
				t.Errorf("keys stored: Do's %d, DoBatch's %d; want 1 and 1", a, b)
			}
		})
	}
	t.Run("beyond every partition", func(t *testing.T) {
		r := dedupetest.Req("s", v7Minted(dbNow.Add(30*day)), "p")
		var invalid *dedupe.InvalidKeyError
		if _, err := near.Do(ctx, r, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); !errors.As(err, &invalid) {
			t.Errorf("Do: %v; want an InvalidKeyError", err)
		}
		out, err := near.DoBatch(ctx, []dedupe.Request{r}, func(context.Context, pgx.Tx, []int) ([][]byte, error) { return nil, nil })
		if err != nil || !errors.As(out[0].Err, &invalid) {
			t.Errorf("DoBatch: %v %+v; want an InvalidKeyError", err, out)
		}
		if n := stored(r); n != 0 {
			t.Errorf("%d keys stored", n)
		}
	})
}

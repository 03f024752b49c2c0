package pgstore_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

func TestPositionsSaveLoad(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	p := store.Positions()
	if err := p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	load := func(group, topic string, parts ...int) map[int]int64 {
		t.Helper()
		got, err := p.Load(ctx, group, topic, parts)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := load("g", "t", 0, 1, 2); len(got) != 0 {
		t.Fatalf("before any save: %v", got)
	}
	if _, err := p.Save(ctx, "g", "t", map[int]int64{2: 7, 0: 3}, nil); err != nil {
		t.Fatal(err)
	}
	// A later save overwrites, also with a lower offset (a group rewound
	// by an operator, a topic recreated).
	if _, err := p.Save(ctx, "g", "t", map[int]int64{0: 5, 1: 0, 2: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Save(ctx, "other", "t", map[int]int64{0: 100}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Save(ctx, "g", "t2", map[int]int64{0: 200}, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := load("g", "t", 0, 1, 2, 3), map[int]int64{0: 5, 1: 0, 2: 4}; !maps.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	if got, want := load("g", "t", 2), map[int]int64{2: 4}; !maps.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	if _, err := p.Save(ctx, "g", "t", map[int]int64{1: -1}, nil); err == nil || !strings.Contains(err.Error(), "partition 1") {
		t.Fatalf("a negative offset: %v", err)
	}
	if _, err := p.Save(ctx, "g", "t", nil, nil); err != nil {
		t.Fatalf("nothing to save: %v", err)
	}
	// A save that expects positions the table no longer holds (the
	// database went back in time) stores nothing and says what it holds.
	behind, err := p.Save(ctx, "g", "t", map[int]int64{0: 9, 2: 9, 3: 9}, map[int]int64{0: 5, 2: 6, 3: 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{2: 4, 3: -1}; !maps.Equal(behind, want) {
		t.Fatalf("behind %v, want %v", behind, want)
	}
	if got, want := load("g", "t", 0, 1, 2, 3), map[int]int64{0: 5, 1: 0, 2: 4}; !maps.Equal(got, want) {
		t.Fatalf("after a refused save: %v, want %v", got, want)
	}
	// Expected positions it holds, or exceeds: stored.
	if behind, err := p.Save(ctx, "g", "t", map[int]int64{0: 9, 2: 9}, map[int]int64{0: 5, 2: 3}); err != nil || behind != nil {
		t.Fatalf("save with expectations met: %v %v", behind, err)
	}
	if got, want := load("g", "t", 0, 2), map[int]int64{0: 9, 2: 9}; !maps.Equal(got, want) {
		t.Fatalf("after a save with expectations met: %v, want %v", got, want)
	}
	// A running consumer's save (expected not nil) never moves a position
	// backwards: a late save of a member that lost the partition keeps
	// the new owner's position, and stores the others.
	if behind, err := p.Save(ctx, "g", "t", map[int]int64{0: 7, 2: 10}, map[int]int64{0: 5}); err != nil || behind != nil {
		t.Fatalf("a late save: %v %v", behind, err)
	}
	if got, want := load("g", "t", 0, 2), map[int]int64{0: 9, 2: 10}; !maps.Equal(got, want) {
		t.Fatalf("after a late save: %v, want %v", got, want)
	}
	// The same table through NewPositions.
	p2, err := pgstore.NewPositions(db.Pool, &pgstore.PositionsConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p2.Load(ctx, "other", "t", []int{0}); err != nil || got[0] != 100 {
		t.Fatalf("NewPositions loads %v %v", got, err)
	}
}

func TestPositionsMisconfigured(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	p, err := pgstore.NewPositions(db.Pool, &pgstore.PositionsConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check(ctx); !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "migrations.Migrate") {
		t.Fatalf("Check on an unmigrated schema: %v", err)
	}
	if _, err := p.Load(ctx, "g", "t", []int{0}); !errors.Is(err, dedupe.ErrMisconfigured) {
		t.Fatalf("Load on an unmigrated schema: %v", err)
	}
	if _, err := pgstore.NewPositions(db.Pool, &pgstore.PositionsConfig{Table: "bad name"}); err == nil || !strings.Contains(err.Error(), "PositionsConfig.Table") {
		t.Fatalf("a bad table name: %v", err)
	}
}

// A claim raises a partition's epoch, and a save with an older epoch
// (a member that lost the partition without knowing it) stores nothing for
// that partition, forward or not, while the partitions it still owns are
// saved; a database gone back to an older epoch refuses no running member.
func TestPositionsClaimFencesTheFormerOwner(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	p := store.Positions()
	if err := p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	load := func() map[int]int64 {
		t.Helper()
		got, err := p.Load(ctx, "g", "t", []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The first member claims both partitions (one repeated) and saves.
	pos, old, err := p.Claim(ctx, "g", "t", []int{1, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(pos) != 0 || len(old) != 2 || old[0] <= 0 || old[1] <= 0 {
		t.Fatalf("first claim: positions %v epochs %v, want none and an epoch each", pos, old)
	}
	if behind, lost, err := p.SaveClaimed(ctx, "g", "t", map[int]int64{0: 5, 1: 3}, map[int]int64{}, old); err != nil || behind != nil || lost != nil {
		t.Fatalf("the owner's save: behind %v lost %v err %v", behind, lost, err)
	}
	// A second member is assigned partition 1 and claims it.
	pos, cur, err := p.Claim(ctx, "g", "t", []int{1})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(pos, map[int]int64{1: 3}) || len(cur) != 1 || cur[1] <= old[1] {
		t.Fatalf("second claim: positions %v epochs %v, want 1:3 and an epoch above %d", pos, cur, old[1])
	}
	// The first member, unaware, saves both forward: partition 0 is its
	// own and is saved, partition 1 is lost to it.
	behind, lost, err := p.SaveClaimed(ctx, "g", "t", map[int]int64{0: 6, 1: 9}, map[int]int64{0: 5, 1: 3}, old)
	if err != nil || behind != nil || !slices.Equal(lost, []int{1}) {
		t.Fatalf("the former owner's save: behind %v lost %v err %v, want partition 1 lost", behind, lost, err)
	}
	if got, want := load(), map[int]int64{0: 6, 1: 3}; !maps.Equal(got, want) {
		t.Fatalf("after the former owner's save: %v, want %v", got, want)
	}
	// The new owner saves on.
	if behind, lost, err := p.SaveClaimed(ctx, "g", "t", map[int]int64{1: 4}, map[int]int64{1: 3}, cur); err != nil || behind != nil || lost != nil {
		t.Fatalf("the new owner's save: behind %v lost %v err %v", behind, lost, err)
	}
	// Unfenced saves (an operator's rewind, a Subscriber without claims)
	// are stored as before.
	if _, err := p.Save(ctx, "g", "t", map[int]int64{1: 2}, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := load(), map[int]int64{0: 6, 1: 2}; !maps.Equal(got, want) {
		t.Fatalf("after the operator's save: %v, want %v", got, want)
	}
	// A restore takes the claims back to an older epoch: the running
	// owner's higher epoch is not refused.
	if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_positions_claims")+" SET epoch = 1"); err != nil {
		t.Fatal(err)
	}
	if behind, lost, err := p.SaveClaimed(ctx, "g", "t", map[int]int64{1: 8}, map[int]int64{1: 2}, cur); err != nil || behind != nil || lost != nil {
		t.Fatalf("after a restore, the owner's save: behind %v lost %v err %v", behind, lost, err)
	}
	if got, want := load(), map[int]int64{0: 6, 1: 8}; !maps.Equal(got, want) {
		t.Fatalf("after the restore and a save: %v, want %v", got, want)
	}
	// A member assigned the partition after the restore claims above every
	// claim made before it, so the owner before it is fenced.
	if _, third, err := p.Claim(ctx, "g", "t", []int{1}); err != nil || third[1] <= cur[1] {
		t.Fatalf("a claim after the restore: %v %v, want an epoch above %d", third, err, cur[1])
	}
	if _, lost, err := p.SaveClaimed(ctx, "g", "t", map[int]int64{1: 9}, map[int]int64{1: 8}, cur); err != nil || !slices.Equal(lost, []int{1}) {
		t.Fatalf("the owner before the restore's claim: lost %v err %v, want partition 1 lost", lost, err)
	}
}

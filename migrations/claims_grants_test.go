package migrations_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

// TestUpgradeClaimsForThePositionsOwner: the tables were migrated up to 12
// by their owner role, which the application also runs as (it saves
// positions as their owner, with no grant); 00013 is run by a migrator that
// is a member of that role. The owner then claims and saves its partitions
// as it saved them before, with no new grant.
func TestUpgradeClaimsForThePositionsOwner(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	owner, migrator := randomName("t_owner_"), randomName("t_migrator_")
	newRole(t, adm, owner)
	newRole(t, adm, migrator)
	exec(t, adm, "GRANT "+owner+" TO "+migrator)
	schema := randomName("t_")
	exec(t, adm, "CREATE SCHEMA "+schema+" AUTHORIZATION "+owner)
	ownPool := connectAs(t, adm, owner)
	if err := migrations.Migrate(ctx, ownPool, &migrations.Config{Schema: schema, Version: 12}); err != nil {
		t.Fatal(err)
	}
	positions, err := pgstore.NewPositions(ownPool, &pgstore.PositionsConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := positions.Save(ctx, "g", "t", map[int]int64{0: 2}, nil); err != nil {
		t.Fatalf("save as the owner at version 12: %v", err)
	}
	if err := migrations.Migrate(ctx, connectAs(t, adm, migrator), &migrations.Config{Schema: schema}); err != nil {
		t.Fatalf("migrate to the latest as a member of the owner role: %v", err)
	}
	_, epochs, err := positions.Claim(ctx, "g", "t", []int{0})
	if err != nil {
		t.Fatalf("claim as the owner of exactly_positions after 00013 run by a member of its role: %v", err)
	}
	if _, lost, err := positions.SaveClaimed(ctx, "g", "t", map[int]int64{0: 3}, map[int]int64{0: 2}, epochs); err != nil || lost != nil {
		t.Fatalf("save claimed positions as that owner: %v %v", lost, err)
	}
}

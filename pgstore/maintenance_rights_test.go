package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// CheckMaintenance: the tables' owner may run the clean-up of either
// layout; a role that may only read and write rows may run the legacy
// layout's (DELETE) but not the partitioned layout's, which runs DDL, and
// the error names what it lacks; without DELETE, neither.
func TestCheckMaintenance(t *testing.T) {
	t.Parallel()
	owner, db := storeMakers[pgstore.LayoutPartitioned](t, nil)
	ctx := context.Background()
	rows := db.RowsOnlyPool(t)
	// The single table's, on a schema of its own (the partitioned
	// layout's clean-up dropped this one's).
	sdb := pgtest.New(t)
	srows := sdb.RowsOnlyPool(t)
	store := func(layout pgstore.Layout) *pgstore.Store {
		p, schema := rows, db.Schema
		if layout == pgstore.LayoutSingleTable {
			p, schema = srows, sdb.Schema
		}
		s, err := pgstore.New(p, &pgstore.Config{Schema: schema, Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := owner.CheckMaintenance(ctx); err != nil {
		t.Fatalf("the owner, partitioned layout: %v", err)
	}
	if err := store(pgstore.LayoutSingleTable).CheckMaintenance(ctx); err != nil {
		t.Fatalf("a role with DELETE, legacy layout: %v", err)
	}
	part := store(pgstore.LayoutPartitioned)
	err := part.CheckMaintenance(ctx)
	if !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "ownership of") || !strings.Contains(err.Error(), "CREATE on schema") {
		t.Fatalf("a role without DDL, partitioned layout: %v; want a misconfiguration naming ownership and CREATE", err)
	}
	// The same role still claims: only its clean-up is refused.
	if c, err := part.Do(ctx, dedupe.Request{Key: dedupe.Key{Scope: "s", ID: "a"}, Fingerprint: dedupe.FingerprintOf([]byte("p"))}, noop); err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("a claim by the role without DDL: %v %v", c.Decision, err)
	}
	var role string
	if err := srows.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Pool.Exec(ctx, `REVOKE DELETE ON `+sdb.Table("exactly_keys")+` FROM "`+role+`"`); err != nil {
		t.Fatal(err)
	}
	if err := store(pgstore.LayoutSingleTable).CheckMaintenance(ctx); !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "DELETE on") {
		t.Fatalf("a role without DELETE, legacy layout: %v", err)
	}
}

// A consumer role granted the partitioned table only (docs/keys.md), not
// its partitions, claims every kind of ID, alone and in batches, with
// results: statements that could name a partition go through the
// partitioned table when the role may not use the partition itself.
func TestPartitionedClaimsWithTableGrantsOnly(t *testing.T) {
	t.Parallel()
	_, db := storeMakers[pgstore.LayoutPartitioned](t, nil)
	ctx := context.Background()
	rows := db.RowsOnlyPool(t)
	var role string
	if err := rows.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	parts, err := db.Pool.Query(ctx, "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1::regclass", db.Table("exactly_keys2"))
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(parts, pgx.RowTo[string])
	if err != nil || len(names) < 2 {
		t.Fatalf("partitions %v (%v)", names, err)
	}
	for _, n := range names {
		if _, err := db.Pool.Exec(ctx, "REVOKE ALL ON "+n+" FROM "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	s, err := pgstore.New(rows, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{uuid.NewString(), uuid.Must(uuid.NewV7()).String(), "order-7"}
	for _, id := range ids {
		if c, err := s.Do(ctx, dedupetest.Req("s", id, "p"), func(context.Context, pgx.Tx) ([]byte, error) { return []byte("r"), nil }); err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("Do %s as a role granted the table only: %v %v", id, c.Decision, err)
		}
		if c, err := s.Do(ctx, dedupetest.Req("s", id, "p"), noop); err != nil || c.Decision != dedupe.DecisionDuplicate || string(c.Record.Result) != "r" {
			t.Fatalf("Do %s again: %v %q %v", id, c.Decision, c.Record.Result, err)
		}
	}
	batch := reqsOf("s", uuid.NewString(), uuid.Must(uuid.NewV7()).String(), "order-8")
	out, err := s.DoBatch(ctx, batch, applyBatch(db, batch, nil))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range out {
		if c.Err != nil || c.Decision != dedupe.DecisionNew || string(c.Record.Result) != "r:"+batch[i].Key.ID {
			t.Fatalf("batch claim %s: %+v", batch[i].Key, c)
		}
	}
}

// Partitions that maintenance creates belong to the partitioned table's
// owner, whichever member of the owner role ran it, so that another member
// can retire them.
func TestPartitionsBelongToTheTableOwner(t *testing.T) {
	t.Parallel()
	_, _, db := newPartitioned(t, nil, "1 second")
	ctx := context.Background()
	var owner string
	if err := db.Pool.QueryRow(ctx, "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = $1::regclass", db.Table("exactly_keys2")).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	member := db.RolePool(t, "GRANT "+pgx.Identifier{owner}.Sanitize()+" TO {role}")
	s, err := pgstore.New(member, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned, PartitionsAhead: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckMaintenance(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil { // creates the first partitions, as the member
		t.Fatal(err)
	}
	var parts int
	var owners []string
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), array_agg(DISTINCT pg_get_userbyid(c.relowner)) FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass AND c.relname <> 'exactly_keys2_other'`, db.Table("exactly_keys2")).
		Scan(&parts, &owners); err != nil {
		t.Fatal(err)
	}
	if parts < 3 || len(owners) != 1 || owners[0] != owner {
		t.Fatalf("%d time partitions owned by %v, want 3 or more, all by %s", parts, owners, owner)
	}
}

// The time partitions that maintenance creates get the partitioned table's
// grants: a consumer role granted the table only (docs/grants.md) may then
// claim in a key's partition by its name, a statement planned once.
func TestPartitionsGetTheTableGrants(t *testing.T) {
	t.Parallel()
	owner, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	rows := db.RowsOnlyPool(t) // granted the tables there are: no time partition yet
	var role string
	if err := rows.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	if err := owner.Check(ctx); err != nil {
		t.Fatal(err)
	}
	var parts, granted int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE has_table_privilege($1, c.oid, 'SELECT')
    AND has_table_privilege($1, c.oid, 'INSERT') AND has_table_privilege($1, c.oid, 'UPDATE') AND has_table_privilege($1, c.oid, 'DELETE'))
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $2::regclass AND c.relname LIKE 'exactly_keys2_p%'`,
		role, db.Table("exactly_keys2")).Scan(&parts, &granted); err != nil {
		t.Fatal(err)
	}
	if parts == 0 || granted != parts {
		t.Fatalf("%d of %d time partitions granted to the role granted the partitioned table", granted, parts)
	}
	s, err := pgstore.New(rows, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7()).String()
	for _, want := range []dedupe.Decision{dedupe.DecisionNew, dedupe.DecisionDuplicate} {
		if c, err := s.Do(ctx, dedupetest.Req("s", id, "p"), noop); err != nil || c.Decision != want {
			t.Fatalf("Do %s: %v %v, want %v", id, c.Decision, err, want)
		}
	}
}

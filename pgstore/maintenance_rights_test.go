package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/pgstore"
)

// CheckMaintenance: the tables' owner may run the clean-up of either
// layout; a role that may only read and write rows may run the legacy
// layout's (DELETE) but not the partitioned layout's, which runs DDL, and
// the error names what it lacks; without DELETE, neither.
func TestCheckMaintenance(t *testing.T) {
	t.Parallel()
	owner, _, db := newPartitioned(t, nil, "")
	ctx := context.Background()
	if err := owner.Check(ctx); err != nil {
		t.Fatal(err)
	}
	rows := db.RowsOnlyPool(t)
	store := func(layout pgstore.Layout) *pgstore.Store {
		s, err := pgstore.New(rows, &pgstore.Config{Schema: db.Schema, Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := owner.CheckMaintenance(ctx); err != nil {
		t.Fatalf("the owner, partitioned layout: %v", err)
	}
	if err := store(pgstore.LayoutLegacy).CheckMaintenance(ctx); err != nil {
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
	if err := rows.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `REVOKE DELETE ON `+db.Table("exactly_keys")+` FROM "`+role+`"`); err != nil {
		t.Fatal(err)
	}
	if err := store(pgstore.LayoutLegacy).CheckMaintenance(ctx); !errors.Is(err, dedupe.ErrMisconfigured) || !strings.Contains(err.Error(), "DELETE on") {
		t.Fatalf("a role without DELETE, legacy layout: %v", err)
	}
}

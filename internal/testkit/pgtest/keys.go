package pgtest

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/internal/keyview"
)

// Keys returns a subquery, to use where a table goes in FROM, that lists
// the schema's keys whichever layout stored them (keyview.SQL): the single
// table (exactly_keys) and the partitioned one (exactly_keys2), with the
// columns keyview.Columns. A schema whose single table was dropped lists
// the partitioned one's.
func (d *DB) Keys() string {
	t, err := keyview.Existing(context.Background(), d.Pool, keyview.Schema(d.Table))
	if err != nil {
		t = keyview.Schema(d.Table)
	}
	return keyview.SQL(t)
}

// DeleteKeys deletes the keys of scope (every key when scope is empty)
// from both layouts' tables, as a restore of a backup taken before they
// were claimed would.
func (d *DB) DeleteKeys(t testing.TB, scope string) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{"DELETE FROM " + d.Table("exactly_keys2") + " WHERE $1 = '' OR scope = (SELECT code FROM " +
		d.Table("exactly_key_names") + " WHERE name = $1)"}
	var exists bool
	if err := d.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", d.Table("exactly_keys")).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		stmts = append(stmts, "DELETE FROM "+d.Table("exactly_keys")+" WHERE $1 = '' OR scope = $1")
	}
	for _, q := range stmts {
		if _, err := d.Pool.Exec(ctx, q, scope); err != nil {
			t.Fatalf("pgtest: %s: %v", q, err)
		}
	}
}

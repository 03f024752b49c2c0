package pgtest

import (
	"context"
	"strings"
	"testing"
)

// Keys returns a subquery, to use where a table goes in FROM, that lists
// the schema's keys whichever layout stored them: the single table
// (exactly_keys) and the partitioned one (exactly_keys2, its codes and
// compact IDs written back), with the single table's columns scope, key,
// status ('COMPLETED', 'PROCESSING'), attempts, source_topic,
// source_partition, source_offset, created_at and expires_at. ULIDs are left NULL in key. A
// schema whose single table was dropped lists the partitioned one's.
func (d *DB) Keys() string {
	single := `SELECT scope, key, status, attempts, source_topic, source_partition, source_offset, created_at, expires_at FROM {K}
UNION ALL
`
	var exists bool
	if err := d.Pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", d.Table("exactly_keys")).Scan(&exists); err == nil && !exists {
		single = ""
	}
	return strings.NewReplacer("{K}", d.Table("exactly_keys"), "{K2}", d.Table("exactly_keys2"),
		"{N}", d.Table("exactly_key_names")).Replace(`(
` + single + `SELECT s.name, CASE k.kind
         WHEN 't' THEN k.id_text
         WHEN '7' THEN k.kid::text
         WHEN 'u' THEN encode(set_byte(set_byte(b.b, 0, get_byte(b.b, 6)), 6, get_byte(b.b, 0)), 'hex')::uuid::text
         WHEN 'o' THEN encode(set_byte(b.b, 0, get_byte(b.b, 0) & 31), 'hex')::uuid::text
       END,
       CASE k.status WHEN 'C' THEN 'COMPLETED' ELSE 'PROCESSING' END, k.attempts::int, t.name, k.source_partition, k.source_offset,
       k.created_at, k.expires_at
FROM {K2} k
CROSS JOIN LATERAL (SELECT decode(replace(k.kid::text, '-', ''), 'hex') AS b) b
JOIN {N} s ON s.code = k.scope
LEFT JOIN {N} t ON t.code = k.source_topic
) AS keys`)
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

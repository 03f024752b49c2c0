// Package keyview lists the keys of a schema whichever key layout stored
// them, as rows of one shape: the single table's (exactly_keys) as they
// are, the partitioned layout's (exactly_keys2) with its codes and compact
// IDs written back. It is for tools and tests that read keys (replay
// verify, the test kit); the stores never read keys through it.
package keyview

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Columns are the columns of a view's rows, in order.
const Columns = "scope, key, fingerprint, status, attempts, source_topic, source_partition, source_offset, created_at, expires_at"

// Tables names the key tables of a schema, each quoted and schema-qualified
// (pgx.Identifier.Sanitize); an empty name leaves its layout out.
type Tables struct {
	Single      string // exactly_keys
	Partitioned string // exactly_keys2
	Names       string // exactly_key_names
}

// Schema names the default key tables of schema, quoted (quote is
// pgx.Identifier{schema, name}.Sanitize or the like).
func Schema(quote func(name string) string) Tables {
	return Tables{Single: quote("exactly_keys"), Partitioned: quote("exactly_keys2"), Names: quote("exactly_key_names")}
}

// Existing returns t without the tables that db (a pool, connection or
// transaction) does not have: the single table once the clean-up dropped
// it, the partitioned one before its migration.
func Existing(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, t Tables) (Tables, error) {
	var single, part bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL", t.Single, t.Partitioned).
		Scan(&single, &part); err != nil {
		return t, err
	}
	if !single {
		t.Single = ""
	}
	if !part {
		t.Partitioned, t.Names = "", ""
	}
	return t, nil
}

// SQL returns a subquery, to use where a table goes in FROM (aliased
// "keys"), with Columns: scope and key as text, fingerprint as 64 hex
// digits, status 'COMPLETED' or 'PROCESSING', attempts, the source topic,
// partition and offset, created_at and expires_at. The partitioned layout
// stores an ID in compact form only when that form gives it back exactly
// (canonical UUIDs, UUIDv7s and ULIDs), so key is the ID as it was
// claimed in either layout.
func SQL(t Tables) string {
	var parts []string
	if t.Single != "" {
		parts = append(parts, "SELECT scope, key, fingerprint::text, status, attempts, source_topic, source_partition, source_offset, created_at, expires_at FROM "+t.Single)
	}
	if t.Partitioned != "" {
		parts = append(parts, strings.NewReplacer("{K2}", t.Partitioned, "{N}", t.Names).Replace(partitioned))
	}
	if len(parts) == 0 {
		return "(SELECT " + empty + " WHERE false) AS keys"
	}
	return "(\n" + strings.Join(parts, "\nUNION ALL\n") + "\n) AS keys"
}

const empty = `NULL::text AS scope, NULL::text AS key, NULL::text AS fingerprint, NULL::text AS status, NULL::int AS attempts,
NULL::text AS source_topic, NULL::int AS source_partition, NULL::bigint AS source_offset,
NULL::timestamptz AS created_at, NULL::timestamptz AS expires_at`

// partitioned writes the stored IDs back (pgstore's encodeID, reversed):
// 't' text in id_text; '7' a UUIDv7 as it is; 'o' an old UUIDv7, its first
// byte's top 3 bits set; 'u' another UUID, bytes 0 and 6 swapped; 'l' a
// ULID and 'p' an old one (top 3 bits set), in Crockford's base 32: 26
// digits of 5 bits over the 128 bits with 2 zero bits in front.
const partitioned = `SELECT s.name AS scope, CASE k.kind
         WHEN 't' THEN k.id_text
         WHEN '7' THEN k.kid::text
         WHEN 'o' THEN encode(set_byte(b.b, 0, get_byte(b.b, 0) & 31), 'hex')::uuid::text
         WHEN 'u' THEN encode(set_byte(set_byte(b.b, 0, get_byte(b.b, 6)), 6, get_byte(b.b, 0)), 'hex')::uuid::text
         WHEN 'l' THEN (SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', 1 + d.v, 1), '' ORDER BY d.i) FROM (
             SELECT i, sum(CASE WHEN m < 0 THEN 0 ELSE get_bit(b.b, (m / 8) * 8 + 7 - m % 8) END << (4 - j))::int AS v
             FROM generate_series(0, 25) i, generate_series(0, 4) j, LATERAL (SELECT 5 * i + j - 2 AS m) m GROUP BY i) d)
         WHEN 'p' THEN (SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', 1 + d.v, 1), '' ORDER BY d.i) FROM (
             SELECT i, sum(CASE WHEN m < 0 THEN 0 ELSE get_bit(set_byte(b.b, 0, get_byte(b.b, 0) & 31), (m / 8) * 8 + 7 - m % 8) END << (4 - j))::int AS v
             FROM generate_series(0, 25) i, generate_series(0, 4) j, LATERAL (SELECT 5 * i + j - 2 AS m) m GROUP BY i) d)
       END AS key,
       encode(k.fingerprint, 'hex') AS fingerprint, CASE k.status WHEN 'C' THEN 'COMPLETED' ELSE 'PROCESSING' END AS status,
       k.attempts::int AS attempts, t.name AS source_topic, k.source_partition, k.source_offset, k.created_at, k.expires_at
FROM {K2} k
CROSS JOIN LATERAL (SELECT decode(replace(k.kid::text, '-', ''), 'hex') AS b) b
JOIN {N} s ON s.code = k.scope
LEFT JOIN {N} t ON t.code = k.source_topic`

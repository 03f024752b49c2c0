package sqlident

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestDefaultSchema(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://h/db", "public"},
		{"postgres://h/db?search_path=ledger", "ledger"},
		{"postgres://h/db?search_path=%22%24user%22,%20ledger,public", "ledger"},
		{"postgres://h/db?search_path=pg_catalog", "public"},
		{"postgres://h/db?search_path=%22Mixed%22", "Mixed"},
	} {
		cc, err := pgx.ParseConfig(c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if got := DefaultSchema(cc); got != c.want {
			t.Errorf("DefaultSchema(%s) = %q, want %q", c.dsn, got, c.want)
		}
	}
	if got := DefaultSchema(nil); got != "public" {
		t.Errorf("DefaultSchema(nil) = %q", got)
	}
}

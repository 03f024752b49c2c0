// Package sqlident checks the SQL identifiers that users configure (schema
// and table names). Quoting is pgx.Identifier's Sanitize, everywhere; the
// check keeps names plain, so that the quoted name is the one an unquoted
// name in the user's own SQL means, and so that goose and search_path, which
// take the schema name as it is, can be given it.
package sqlident

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

var valid = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Check returns an error naming field when name is not a plain identifier:
// a lowercase letter or underscore, then lowercase letters, digits or underscores,
// 63 bytes at most: names that Postgres never folds or needs to quote.
func Check(field, name string) error {
	if !valid.MatchString(name) {
		return fmt.Errorf("%s %q is not a valid identifier: use lowercase letters, digits and underscores, starting with a letter or underscore, at most 63 bytes", field, name)
	}
	return nil
}

// DefaultSchema is the schema that exactly's tables default to when a
// Config leaves Schema empty: the first schema of the search_path set in the
// connection string (or pgx.ConnConfig.RuntimeParams), skipping "$user" and
// the system schemas; "public" when it names none. Migrations, the key store,
// the outbox and the user's own unqualified SQL then all follow one setting.
func DefaultSchema(cc *pgx.ConnConfig) string {
	if cc == nil {
		return "public"
	}
	for _, s := range strings.Split(cc.RuntimeParams["search_path"], ",") {
		s = strings.TrimSpace(s)
		if unq, ok := strings.CutPrefix(s, `"`); ok {
			s = strings.TrimSuffix(unq, `"`)
		}
		switch s {
		case "", "$user", "pg_catalog", "pg_temp", "information_schema":
			continue
		}
		return s
	}
	return "public"
}

// Package sqlident checks the SQL identifiers that users configure (schema
// and table names). Quoting is pgx.Identifier's Sanitize, everywhere; the
// check keeps names plain, so that the quoted name is the one an unquoted
// name in the user's own SQL means, and so that goose and search_path, which
// take the schema name as it is, can be given it.
package sqlident

import (
	"fmt"
	"regexp"
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

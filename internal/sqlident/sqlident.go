// Package sqlident checks and quotes the SQL identifiers that users
// configure (schema and table names), so none is ever spliced into SQL raw.
package sqlident

import (
	"fmt"
	"regexp"
	"strings"
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

// Quote returns name as a quoted identifier. name must have passed Check.
func Quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Qualified returns "schema"."name".
func Qualified(schema, name string) string { return Quote(schema) + "." + Quote(name) }

// Package advisory names the Postgres advisory locks the module takes.
package advisory

import "hash/fnv"

// LockID is the advisory lock key of name: the FNV-1a 64-bit hash of
// "exactly/" + name. Every lock of the module is named this way
// ("migrations/<schema>", "cleanup/<schema>.<table>", ...), so that two
// versions of the module running side by side take the same lock.
func LockID(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("exactly/" + name))
	return int64(h.Sum64())
}

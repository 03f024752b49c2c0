package advisory

import (
	"hash/fnv"
	"testing"
)

// The keys are those the module took before this package existed: a
// process of an older version and one of this version must exclude each
// other.
func TestLockIDUnchanged(t *testing.T) {
	old := func(s string) int64 {
		h := fnv.New64a()
		h.Write([]byte(s))
		return int64(h.Sum64())
	}
	for _, name := range []string{"migrations/public", "cleanup/public.exactly_keys", "outbox/ledger.exactly_outbox"} {
		if got, want := LockID(name), old("exactly/"+name); got != want {
			t.Fatalf("LockID(%q) = %d, want %d", name, got, want)
		}
	}
}

package pgstore

import "time"

// SetDropAfter sets how long s's maintenance waits, once it sees the
// single table retired, before it drops it (2 × stateTTL by default).
func SetDropAfter(s *Store, d time.Duration) { s.part().dropAfter = d }

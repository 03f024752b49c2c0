package kgopubsub

import "testing"

// A record is copied on its last two deliveries, never on its first (a
// copy's first delivery would copy it again, and again).
func TestCopyFrom(t *testing.T) {
	for limit, want := range map[int32]int32{2: 2, 3: 2, 4: 3, 5: 4, 10: 9} {
		if got := copyFrom(limit); got != want {
			t.Errorf("copyFrom(%d) = %d, want %d", limit, got, want)
		}
	}
}

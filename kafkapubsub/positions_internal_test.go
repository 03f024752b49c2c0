package kafkapubsub

import "testing"

// A partition starts at the earlier of Kafka's committed offset and the
// database's position; with only one of them, at that one.
func TestStartOffset(t *testing.T) {
	for _, c := range []struct {
		kafka, db int64
		has       bool
		want      int64
	}{
		{kafka: 10, db: 4, has: true, want: 4},                // the database lost commits
		{kafka: 10, db: 12, has: true, want: 10},              // the Kafka commit after the save did not happen
		{kafka: 10, db: 10, has: true, want: 10},              // agreement
		{kafka: 10, has: false, want: 10},                     // no position yet
		{kafka: int64(StartFirst), db: 7, has: true, want: 7}, // Kafka forgot the group
		{kafka: int64(StartLast), db: 7, has: true, want: 7},
		{kafka: int64(StartFirst), has: false, want: int64(StartFirst)},
	} {
		if got := startOffset(c.kafka, c.db, c.has); got != c.want {
			t.Errorf("startOffset(%d, %d, %v) = %d, want %d", c.kafka, c.db, c.has, got, c.want)
		}
	}
}

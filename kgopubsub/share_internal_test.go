package kgopubsub

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/mdkeys"
)

// A record is copied on its last two deliveries, never on its first (a
// copy's first delivery would copy it again, and again).
func TestCopyFrom(t *testing.T) {
	for limit, want := range map[int32]int32{2: 2, 3: 2, 4: 3, 5: 4, 10: 9} {
		if got := copyFrom(limit); got != want {
			t.Errorf("copyFrom(%d) = %d, want %d", limit, got, want)
		}
	}
}

// A copy's origin header counts only when it names an earlier record of
// the copy's own topic and partition: a record copied as it was from
// another topic (replay copy keeps headers and partitions), or one whose
// header is garbage, is its own origin.
func TestOriginOffset(t *testing.T) {
	for value, want := range map[string]int64{
		"":                50,
		"cmds/1/10":       10,
		"cmds/1/49":       49,
		"cmds/1/50":       50, // not earlier
		"cmds/1/60":       50,
		"cmds/2/10":       50, // another partition
		"other/1/10":      50, // another topic
		"cmds/1/-1":       50,
		"cmds/1/x":        50,
		"10":              50,
		"cmds/1/10/extra": 50,
		"cmds.more/1/10":  50,
	} {
		r := &kgo.Record{Topic: "cmds", Partition: 1, Offset: 50}
		if value != "" {
			r.Headers = []kgo.RecordHeader{{Key: mdkeys.ShareOrigin, Value: []byte(value)}}
		}
		if got := originOffset(r); got != want {
			t.Errorf("origin header %q: originOffset %d, want %d", value, got, want)
		}
	}
	copied := &kgo.Record{Topic: "cmds", Partition: 1, Offset: 50, Headers: []kgo.RecordHeader{{Key: mdkeys.ShareOrigin, Value: []byte("cmds/1/10")}}}
	if got := originAt(copied, originOffset(copied)); got != "cmds/1/10" {
		t.Errorf("a copy of a copy names %q, want the first record, cmds/1/10", got)
	}
}

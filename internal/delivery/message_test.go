package delivery

import (
	"context"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

type hdr struct {
	Key   string
	Value []byte
}

func keysOf(hs []hdr) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// A record published as it arrived keeps its headers in order (a repeated
// name and the ID header included), leaves out those whose metadata
// changed or went, and adds the new metadata sorted by name, reserved
// names left out.
func TestAsArrived(t *testing.T) {
	arrived := []hdr{{"id", []byte("u1")}, {"a", []byte("1")}, {"b", []byte("2")}, {"a", []byte("1")}, {"c", []byte("3")}}
	md := message.Metadata{"a": "1", "b": "changed", "z": "26", "y": "25", "_reserved": "x"}
	got := keysOf(AsArrived(arrived, md, "id", func(k string) bool { return k == "_reserved" }))
	want := []string{"id=u1", "a=1", "a=1", "b=changed", "y=25", "z=26"}
	if !slices.Equal(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
}

// Arrived finds the record a message was made of only under the ID it
// arrived with.
func TestArrived(t *testing.T) {
	type record struct{ headers []hdr }
	r := &record{headers: []hdr{{"id", []byte("old")}, {"id", []byte("u1")}}}
	uuid := func(r *record) string { return Last(r.headers, "id") }
	msg := message.NewMessage("u1", nil)
	msg.SetContext(WithArrived(context.Background(), r))
	if Arrived(msg, uuid) != r {
		t.Fatal("the record a message arrived as was not found under its ID (the last ID header)")
	}
	msg.UUID = "u2"
	if Arrived(msg, uuid) != nil {
		t.Fatal("a message published under another ID was taken for the record it arrived as")
	}
	if Arrived(message.NewMessage("u1", nil), uuid) != nil {
		t.Fatal("a message no Subscriber delivered was taken for a record")
	}
}

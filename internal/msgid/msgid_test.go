package msgid_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/msgid"
)

func TestNewIsTimeOrdered(t *testing.T) {
	prev := ""
	for i := 0; i < 1000; i++ {
		id := msgid.New()
		p, err := dedupe.ParseTimeID(id)
		if err != nil || p.Kind != dedupe.UUIDv7 || p.String() != id {
			t.Fatalf("New() = %q: %v", id, err)
		}
		if id <= prev {
			t.Fatalf("New() = %q went back in time after %q", id, prev)
		}
		prev = id
	}
}

func TestFill(t *testing.T) {
	kept := message.NewMessage("given", nil)
	empty := message.NewMessage("", nil)
	msgid.Fill([]*message.Message{kept, empty, nil})
	if kept.UUID != "given" {
		t.Errorf("a given UUID was replaced by %q", kept.UUID)
	}
	if _, err := dedupe.ParseTimeID(empty.UUID); err != nil {
		t.Errorf("an empty UUID became %q: %v", empty.UUID, err)
	}
}

// A derived ID is a pure function of its input, a valid UUIDv7, with the
// input's time (its UUIDv7's, else its record's), and distinct per scope,
// key and index; with no time there is none.
func TestDerive(t *testing.T) {
	derive := func(scope, key string, index int, input string, at time.Time) string {
		t.Helper()
		id, ok := msgid.Derive(scope, key, index, input, at)
		if !ok {
			t.Fatalf("Derive(%q, %q, %d, %q, %v) found no time", scope, key, index, input, at)
		}
		return id
	}
	in := msgid.New()
	a := derive("ledger", in, 0, in, time.Time{})
	if b := derive("ledger", in, 0, in, time.Time{}); a != b {
		t.Fatalf("Derive gave %s, then %s, for the same input", a, b)
	}
	u, err := uuid.Parse(a)
	if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("Derive gave %s (%v): not a UUIDv7", a, err)
	}
	if a[:13] != in[:13] {
		t.Fatalf("Derive gave %s for input %s: not the input's time bits", a, in)
	}
	seen := map[string]bool{a: true}
	for _, d := range []string{derive("ledger", in, 1, in, time.Time{}), derive("audit", in, 0, in, time.Time{}), derive("ledger", in+"x", 0, in, time.Time{})} {
		if seen[d] {
			t.Fatalf("Derive gave %s twice for different scope, key or index", d)
		}
		seen[d] = true
	}
	at := time.UnixMilli(0x0123456789ab)
	d := derive("ledger", "order-1", 0, "order-1", at)
	if got := strings.ReplaceAll(d, "-", "")[:12]; got != "0123456789ab" {
		t.Fatalf("Derive with a record time gave %s: time bits %s, want 0123456789ab", d, got)
	}
	if id, ok := msgid.Derive("ledger", "order-1", 0, "order-1", time.Time{}); ok || id != "" {
		t.Fatalf("Derive with no time gave %q, %v", id, ok)
	}
}

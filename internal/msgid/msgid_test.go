package msgid_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

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

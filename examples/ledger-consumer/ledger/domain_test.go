package ledger

import (
	"errors"
	"testing"

	"github.com/exactly-go/exactly/dedupe"
)

func TestRules(t *testing.T) {
	st := NewMemState()
	steps := []struct {
		c      Command
		reject bool
		avail  int64
		held   int64
	}{
		{Command{Type: Topup, Account: "a", Amount: 100}, false, 100, 0},
		{Command{Type: Hold, Account: "a", Amount: 150, HoldID: "h1"}, true, 100, 0},
		{Command{Type: Hold, Account: "a", Amount: 60, HoldID: "h1"}, false, 40, 60},
		{Command{Type: Hold, Account: "a", Amount: 1, HoldID: "h1"}, true, 40, 60},
		{Command{Type: Capture, Account: "a", Amount: 70, HoldID: "h1"}, true, 40, 60},
		{Command{Type: Capture, Account: "a", Amount: 50, HoldID: "h1"}, false, 40, 10},
		{Command{Type: Release, Account: "a", Amount: 11, HoldID: "h1"}, true, 40, 10},
		{Command{Type: Release, Account: "a", Amount: 10, HoldID: "h1"}, false, 50, 0},
		{Command{Type: Refund, Account: "a", Amount: 51, HoldID: "h1"}, true, 50, 0},
		{Command{Type: Refund, Account: "a", Amount: 20, HoldID: "h1"}, false, 70, 0},
		{Command{Type: Refund, Account: "a", Amount: 31, HoldID: "h1"}, true, 70, 0},
		{Command{Type: Capture, Account: "b", Amount: 1, HoldID: "h1"}, true, 70, 0},
	}
	for i, s := range steps {
		err := Apply(st, s.c)
		if s.reject != IsRejection(err) || (!s.reject && err != nil) {
			t.Fatalf("step %d %+v: err %v, reject %v", i, s.c, err, s.reject)
		}
		if a := st.Accounts["a"]; a.Available != s.avail || a.Held != s.held {
			t.Fatalf("step %d: account %+v, want %d/%d", i, a, s.avail, s.held)
		}
	}
}

func TestParse(t *testing.T) {
	if _, err := Parse([]byte(`{"command_id":"c","type":"topup","account":"a","amount":5}`)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{``, `nope`, `{"command_id":"c","type":"steal","account":"a","amount":5}`,
		`{"command_id":"c","type":"hold","account":"a","amount":5}`, `{"command_id":"c","type":"topup","account":"a","amount":-5}`,
		`{"command_id":"c","type":"topup","account":"a","amount":5,"extra":1}`} {
		_, err := Parse([]byte(bad))
		if !errors.Is(err, ErrMalformed) || !dedupe.IsPermanent(err) {
			t.Errorf("Parse(%q) = %v, want a permanent ErrMalformed", bad, err)
		}
	}
}

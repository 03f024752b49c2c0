package dedupe_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

func ExampleDecide() {
	now := time.Now()
	stored := dedupe.Record{
		Key:         dedupe.Key{Scope: "ledger", ID: "cmd-1"},
		Fingerprint: dedupe.FingerprintOf([]byte(`{"amount":10}`)),
		Status:      dedupe.StatusCompleted,
	}
	outcome, _ := dedupe.Decide(stored, dedupe.FingerprintOf([]byte(`{"amount":10}`)), now)
	fmt.Println(outcome)

	_, err := dedupe.Decide(stored, dedupe.FingerprintOf([]byte(`{"amount":99}`)), now)
	fmt.Println(errors.Is(err, dedupe.ErrKeyReused), dedupe.IsPermanent(err))
	// Output:
	// duplicate
	// true true
}

func ExampleJSONFingerprint() {
	a, _ := dedupe.JSONFingerprint([]byte(`{"amount": 10, "account": "A"}`))
	b, _ := dedupe.JSONFingerprint([]byte(`{"account":"A","amount":10.0}`))
	fmt.Println(a == b, dedupe.FingerprintOf([]byte(`{"amount": 10, "account": "A"}`)) == dedupe.FingerprintOf([]byte(`{"account":"A","amount":10.0}`)))
	// Output: true false
}

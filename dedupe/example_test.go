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

func ExamplePermanent() {
	validate := func(amount int64) error {
		if amount <= 0 {
			return dedupe.Permanent(fmt.Errorf("amount %d: want > 0", amount))
		}
		return nil
	}
	err := validate(-5)
	fmt.Println(err)
	fmt.Println(dedupe.IsPermanent(err), dedupe.IsRetryable(err))
	fmt.Println(dedupe.IsPermanent(dedupe.Retryable(errors.New("payments API down"))))
	// Output:
	// amount -5: want > 0
	// true false
	// false
}

package ledger_test

import (
	"context"
	"testing"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/kafkatest"
	"github.com/exactly-go/exactly/internal/pgtest"
)

func demo(t *testing.T, noDedupe bool) ledger.Summary {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	url, err := pgtest.URL()
	if err != nil {
		t.Skip(err)
	}
	schema := pgtest.NewEmpty(t).Schema // dropped and re-created by the demo, dropped again at the end
	sum, err := ledger.Demo(context.Background(), ledger.DemoConfig{
		DatabaseURL: url, Schema: schema, Brokers: brokers, NoDedupe: noDedupe, Replay: !noDedupe,
		Load: ledger.LoadConfig{Commands: 1500, Accounts: 40, Seed: 42},
	})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// The demo's workload on the resolved broker (the real one in CI): every
// command applied once, every duplicate skipped, every bad record
// dead-lettered, and the balances equal those recomputed from the topic.
func TestDemoWorkload(t *testing.T) {
	t.Parallel()
	sum := demo(t, false)
	w := sum.Workload
	v, c := sum.Verify, sum.Worker
	if !sum.Match() {
		t.Fatalf("balances differ: %v", v.Mismatches)
	}
	if v.Unique != w.Unique || v.Duplicates != w.Duplicates || v.KeyReused != w.KeyReused || v.Malformed != w.Malformed {
		t.Fatalf("verify counted %+v, generated %+v", v, w)
	}
	if c.Applied != int64(w.Unique) || c.KeyReused != int64(w.KeyReused) ||
		c.DeadLettered != int64(w.KeyReused+w.Malformed) || c.Duplicates < int64(w.Duplicates) {
		t.Fatalf("worker counted %+v; workload %+v", c, w)
	}
	if r := sum.Replayed; r.Applied != 0 || r.Duplicates != int64(w.Unique+w.Duplicates) || sum.ReplayElapsed == 0 {
		t.Fatalf("replay of the topic: %+v, want every valid record a duplicate", r)
	}
	if c.Rejected == 0 {
		t.Fatal("no command broke a rule: the workload does not exercise rejections")
	}
}

// Without the dedupe middleware the same workload applies duplicates again,
// and verify catches it.
func TestDemoWithoutDedupeFailsVerify(t *testing.T) {
	t.Parallel()
	if sum := demo(t, true); sum.Match() {
		t.Fatal("verify passed for a consumer that applies duplicates")
	}
}

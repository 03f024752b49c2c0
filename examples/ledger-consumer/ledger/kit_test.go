package ledger_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/worker/workertest"
)

// newKit is a test kit with the ledger's tables, running the ledger's
// worker (NewWorker, as the command line does) with cfg on the kit's
// schema, brokers, topics and group.
func newKit(t *testing.T, partitions int, cfg ledger.Config) *workertest.Kit {
	t.Helper()
	k := workertest.New(t, &workertest.Config{Partitions: partitions})
	if err := ledger.Setup(context.Background(), k.Pool(), k.Schema()); err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	first := k.Group()
	k.Run(func(ctx context.Context, group string) error {
		c := cfg
		c.Schema, c.Brokers, c.Group = k.Schema(), k.Brokers(), group
		c.TakeOver = group != first // a replay's new group takes the scope over
		c.Commands, c.Events, c.DeadLetter = k.Topic(), k.OutputTopic(), k.DeadLetterTopic()
		w, err := ledger.NewWorker(k.Pool(), c)
		if err != nil {
			return err
		}
		return w.Run(ctx)
	})
	return k
}

// command is c as a record on the commands topic: its ID the command's,
// keyed by account as the load generator keys it.
func command(t *testing.T, c ledger.Command) workertest.Command {
	t.Helper()
	payload, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return workertest.Command{ID: c.CommandID, Key: c.Account, Payload: string(payload)}
}

// Each ledger command is applied once, in per-message and in batch mode,
// through an exact duplicate, a redelivery, a reused command ID, a
// malformed record and a replay of the whole topic; a rule violation is
// applied once too, as a rejection with its event.
func TestLedgerAppliesEachCommandOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name  string
		batch int
	}{{"per-message", 0}, {"batch", 50}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			k := newKit(t, 3, ledger.Config{Batch: mode.batch})
			top := command(t, ledger.Command{CommandID: "c-top", Type: ledger.Topup, Account: "acc-1", Amount: 100})
			hold := command(t, ledger.Command{CommandID: "c-hold", Type: ledger.Hold, Account: "acc-1", Amount: 30, HoldID: "h-1"})
			capture := command(t, ledger.Command{CommandID: "c-capture", Type: ledger.Capture, Account: "acc-1", Amount: 20, HoldID: "h-1"})
			top2 := command(t, ledger.Command{CommandID: "c-top2", Type: ledger.Topup, Account: "acc-2", Amount: 50})
			over := command(t, ledger.Command{CommandID: "c-over", Type: ledger.Hold, Account: "acc-2", Amount: 80, HoldID: "h-2"})
			reused := command(t, ledger.Command{CommandID: "c-top", Type: ledger.Topup, Account: "acc-1", Amount: 1000})
			k.Send(top, hold, top, capture, top2, over, reused, workertest.Command{ID: "c-bad", Key: "acc-1", Payload: "{"})
			k.Redeliver("c-hold")
			k.Replay()
			k.AssertRows("SELECT id, available, held FROM accounts ORDER BY id", "acc-1 70 10", "acc-2 50 0")
			k.AssertRows("SELECT id, amount, captured FROM holds", "h-1 30 20")
			k.AssertRows("SELECT command_id, reason FROM rejections", "c-over insufficient funds: available 50, hold 80")
			k.AssertOutputs("evt-c-top", "evt-c-hold", "evt-c-capture", "evt-c-top2", "evt-c-over")
			k.AssertDeadLetters("c-top", "c-bad", "c-top", "c-bad") // the reused ID and the malformed record, on each pass
		})
	}
}

package workertest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/worker"
	"github.com/exactly-go/exactly/worker/workertest"
)

// topUp is the quick start's handler (README.md): the code under test.
func topUp(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	var cmd struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	if err := json.Unmarshal(msg.Payload, &cmd); err != nil || cmd.Account == "" || cmd.Amount <= 0 {
		return nil, dedupe.Permanent(fmt.Errorf("want {\"account\": …, \"amount\": > 0}, got %q", msg.Payload))
	}
	var balance int64
	if err := tx.QueryRow(ctx, "INSERT INTO accounts AS a VALUES ($1, $2) ON CONFLICT (id) DO UPDATE "+
		"SET balance = a.balance + $2 RETURNING balance", cmd.Account, cmd.Amount).Scan(&balance); err != nil {
		return nil, err
	}
	event := fmt.Appendf(nil, `{"account":%q,"balance":%d}`, cmd.Account, balance)
	return []*message.Message{message.NewMessage("topped-up-"+msg.UUID, event)}, nil
}

// A user's whole end-to-end test of a worker: servers, topics, the worker,
// duplicates, a redelivery, a replay and the assertions, in 20 lines
// (TestExampleIsShort holds it under 40).
func TestTopUps(t *testing.T) {
	t.Parallel()
	k := workertest.New(t, &workertest.Config{
		Setup: []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"},
	})
	k.Start(&worker.Config{Scope: "top-ups", Handler: topUp})
	a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
	b := workertest.Command{ID: "cmd-2", Payload: `{"account":"acc-2","amount":20}`}
	c := workertest.Command{ID: "cmd-3", Payload: `{"account":"acc-1","amount":5}`}
	bad := workertest.Command{ID: "cmd-4", Payload: `{"amount":`}
	k.Send(a, a, b, c, bad) // a twice: an exact duplicate, as a producer's retry leaves
	k.Redeliver("cmd-2")    // cmd-2 again, later
	k.Replay()              // a new group consumes the whole topic again
	k.AssertRows("SELECT id, balance FROM accounts ORDER BY id", "acc-1 15", "acc-2 20")
	k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2", "topped-up-cmd-3")
	k.AssertDeadLetters("cmd-4", "cmd-4") // refused for good on each pass over the topic
}

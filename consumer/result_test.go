package consumer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/msgid"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// A command applied again after a restore lost its key (and its outbox
// rows) gives its outputs the same IDs as the first time, so a consumer
// downstream finds them duplicates: per message with the router's
// outputs and with the outbox, and in batch mode. Outputs with no UUID
// carry the command's time bits.
func TestOutputIDsSurviveReapplication(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	wr, err := outbox.NewWriter(&outbox.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	restore := func() {
		t.Helper()
		db.DeleteKeys(t, "ledger")
		if _, err := db.Pool.Exec(ctx, "DELETE FROM "+db.Table("exactly_outbox")); err != nil {
			t.Fatal(err)
		}
	}
	outboxIDs := func() []string {
		t.Helper()
		rows, err := db.Pool.Query(ctx, "SELECT uuid::text FROM "+db.Table("exactly_outbox")+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	outputs := func() []*message.Message {
		return []*message.Message{message.NewMessage("", []byte("debited")), message.NewMessage("", []byte("credited"))}
	}
	command := func(uuid string) *message.Message {
		m := message.NewMessage(uuid, []byte(`{"account":"a","amount":5}`))
		m.Metadata.Set("kafka_timestamp", time.UnixMilli(0x0123456789ab).UTC().Format(time.RFC3339Nano))
		return m
	}
	twice := func(name string, apply func(*message.Message) []string) {
		t.Helper()
		for _, uuid := range []string{msgid.New(), "order-1"} {
			first := apply(command(uuid))
			restore()
			again := apply(command(uuid))
			restore()
			if len(first) != 2 || !slices.Equal(first, again) {
				t.Fatalf("%s, command %s: outputs %v the first time, %v when applied again", name, uuid, first, again)
			}
			if first[0] == first[1] {
				t.Fatalf("%s, command %s: both outputs got %s", name, uuid, first[0])
			}
			want := "0123456789ab"
			if uuid != "order-1" {
				want = uuid[:8] + uuid[9:13]
			}
			for _, id := range first {
				if got := id[:8] + id[9:13]; got != want {
					t.Fatalf("%s, command %s: output %s has time bits %s, want %s", name, uuid, id, got, want)
				}
			}
		}
	}

	router, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// Downstream, an exactly consumer of the events (its keys in another
	// database, untouched by the restore upstream) applies each event once
	// across both applications of each command.
	downstream, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "downstream", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	twice("per message, router outputs", func(m *message.Message) []string {
		outs, err := router.Middleware(func(*message.Message) ([]*message.Message, error) { return outputs(), nil })(m)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, o := range outs {
			ids = append(ids, o.UUID)
			if _, err := downstream.Middleware(func(*message.Message) ([]*message.Message, error) { applied++; return nil, nil })(o); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	})
	if applied != 4 {
		t.Fatalf("downstream applied %d events for 2 commands of 2 events each, each command applied twice upstream; want 4", applied)
	}

	viaOutbox, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Outputs: wr.Outputs("events"), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	twice("per message, outbox", func(m *message.Message) []string {
		if _, err := viaOutbox.Middleware(func(*message.Message) ([]*message.Message, error) { return outputs(), nil })(m); err != nil {
			t.Fatal(err)
		}
		return outboxIDs()
	})

	batch, err := consumer.NewBatchConsumer(store, func(_ context.Context, _ pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
		outs := make([][]*message.Message, len(msgs))
		for i := range msgs {
			outs[i] = outputs()
		}
		return outs, nil
	}, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger", Outputs: wr.Outputs("events"), Logger: quietLogger()}, MaxSize: 1, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	twice("batch, outbox", func(m *message.Message) []string {
		ch := make(chan *message.Message, 1)
		ch <- m
		close(ch)
		if err := batch.Run(ctx, ch); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the batch to be acked", func() bool {
			select {
			case <-m.Acked():
				return true
			default:
				return false
			}
		})
		return outboxIDs()
	})
}

package kgopubsub_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/worker"
)

// The worker on franz-go (one field, Transport): every command sent twice
// is applied once, its output and its dead letters go out through the
// franz-go publisher (the relay's), and the group's offsets reach the end,
// in per-message and in batch mode, positions on, the default key layout.
func TestWorkerOnFranzGo(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kafkatest.RequireReal(t)
			db := pgtest.New(t)
			ctx := context.Background()
			brokers := kafkatest.Brokers(t)
			commands, events, dlq := kafkatest.Topic(t, 3), kafkatest.Topic(t, 3), kafkatest.Topic(t, 1)
			applied := db.Table("applied")
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				if string(msg.Payload) == "poison" {
					return nil, dedupe.Permanent(errors.New("not a command"))
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID); err != nil {
					return nil, err
				}
				return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
			}
			cfg := &worker.Config{Scope: "test", Schema: db.Schema, Brokers: brokers, Topic: commands, OutputTopic: events,
				DeadLetterTopic: dlq, Group: kafkatest.Name("g"), Handler: apply, Tables: []string{"applied"},
				Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond, Transport: kgopubsub.Transport{}}
			if mode == "batch" {
				cfg.Handler, cfg.BatchSize = nil, 20
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
					outs := make([][]*message.Message, len(msgs))
					for i, m := range msgs {
						o, err := apply(ctx, tx, m)
						if err != nil {
							return nil, err
						}
						outs[i] = o
					}
					return outs, nil
				}
			}
			wk, err := worker.New(db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- wk.Run(wctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()

			const n = 60
			var msgs []*message.Message
			for i := range n {
				m := message.NewMessage(uuid.NewString(), []byte(fmt.Sprintf(`{"n": %d}`, i)))
				msgs = append(msgs, m, m.Copy())
			}
			msgs = append(msgs, message.NewMessage(uuid.NewString(), []byte("poison")))
			// Unkeyed: the copies of a command may land on different
			// partitions, and so run at once.
			pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: brokers}})
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(commands, msgs...); err != nil {
				t.Fatal(err)
			}
			if err := pub.Close(); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 2*time.Minute, "every command applied and the group at the end", func() bool {
				var got int
				if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&got); err != nil || got < n {
					return false
				}
				end := kafkatest.EndOffsets(t, commands, 3)
				committed := kafkatest.CommittedOffsets(t, cfg.Group, commands, 3)
				for p := range end {
					if committed[p] != end[p] {
						return false
					}
				}
				return true
			})
			// The group is franz-go's (kafka-go's assignor is "range").
			checkProtocol(t, cfg.Group, kgopubsub.ProtocolClassic, 1)
			var once, twice int
			if err := db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM "+applied).
				Scan(&once, &twice); err != nil || once != n || twice != 0 {
				t.Fatalf("applied once %d, more than once %d (%v); want %d and 0", once, twice, err, n)
			}
			testenv.WaitFor(t, time.Minute, "the outputs and the dead letter published", func() bool {
				ev := kafkatest.EndOffsets(t, events, 3)
				return ev[0]+ev[1]+ev[2] >= n && kafkatest.EndOffsets(t, dlq, 1)[0] >= 1
			})
			if ev := kafkatest.EndOffsets(t, events, 3); ev[0]+ev[1]+ev[2] != n {
				t.Fatalf("%v outputs, want %d: one per command", ev, n)
			}
		})
	}
}

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

// Two workers given one InstanceID (the same pod name in every replica):
// the first, fenced by the broker when the second joins, stops with an
// error instead of running on as healthy while consuming nothing, in
// per-message and in batch mode; the second applies every command.
func TestWorkerFencedByItsInstanceIDStops(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"per-message", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kafkatest.RequireReal(t)
			db := pgtest.New(t)
			ctx := context.Background()
			brokers := kafkatest.Brokers(t)
			commands, dlq, group := kafkatest.Topic(t, 3), kafkatest.Topic(t, 1), kafkatest.Name("g")
			applied := db.Table("applied")
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (id text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1)", msg.UUID)
				return nil, err
			}
			newWorker := func() *worker.Worker {
				cfg := &worker.Config{Scope: "test", Schema: db.Schema, Brokers: brokers, Topic: commands, DeadLetterTopic: dlq, Group: group, Handler: apply,
					Tables: []string{"applied"}, Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond,
					Transport: kgopubsub.Transport{InstanceID: "pod"}}
				if mode == "batch" {
					cfg.Handler, cfg.BatchSize = nil, 20
					cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
						for _, m := range msgs {
							if _, err := apply(ctx, tx, m); err != nil {
								return nil, err
							}
						}
						return make([][]*message.Message, len(msgs)), nil
					}
				}
				wk, err := worker.New(db.Pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return wk
			}
			pub, err := kgopubsub.NewPublisher(&kgopubsub.PublisherConfig{PublisherConfig: kafkapubsub.PublisherConfig{Brokers: brokers}})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			produce := func() {
				msgs := make([]*message.Message, 60)
				for i := range msgs {
					msgs[i] = message.NewMessage(uuid.NewString(), []byte(fmt.Sprintf(`{"n": %d}`, i)))
				}
				if err := pub.Publish(commands, msgs...); err != nil {
					t.Fatal(err)
				}
			}
			produce()
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			first, second := newWorker(), newWorker()
			firstDone, secondDone := make(chan error, 1), make(chan error, 1)
			go func() { firstDone <- first.Run(wctx) }()
			select {
			case <-first.Running():
			case err := <-firstDone:
				t.Fatalf("the first worker's Run: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("the first worker did not start consuming within a minute")
			}
			// The first has applied commands (it holds its partitions, as a
			// running replica does) before the second joins: a second
			// join that came while the first's was still settling was
			// fenced only after a minute once, on a loaded machine.
			testenv.WaitFor(t, time.Minute, "the first worker to apply the first commands", func() bool {
				var n int
				err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&n)
				return err == nil && n == 60
			})
			go func() { secondDone <- second.Run(wctx) }()
			select {
			case err := <-firstDone:
				if !errors.Is(err, worker.ErrSubscriptionEnded) {
					t.Fatalf("the fenced worker's Run: %v, want the subscription ended", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the fenced worker still runs a minute after the second joined with its InstanceID")
			}
			produce()
			var n int
			testenv.WaitFor(t, time.Minute, "the second worker to apply every command", func() bool {
				if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 120
			})
			cancel()
			if err := <-secondDone; err != nil {
				t.Errorf("the second worker's Run: %v", err)
			}
		})
	}
}

// Command quickstart applies top-up commands from Kafka to Postgres exactly
// once. It sends a few commands (one of them twice, one malformed), handles
// them and exits; run it again and every command is a duplicate.
//
//	go run ./examples/quickstart -db postgres://… -brokers localhost:9092
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

func main() {
	dbURL := flag.String("db", "postgres://postgres:postgres@localhost:5432/postgres", "Postgres URL")
	brokerList := flag.String("brokers", "localhost:9092", "Kafka brokers, comma-separated")
	schema := flag.String("schema", "ledger", "Postgres schema of the accounts and exactly's tables")
	prefix := flag.String("prefix", "ledger", "prefix of the topics (.commands, .events, .dlq) and the consumer group")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dbURL, strings.Split(*brokerList, ","), *schema, *prefix); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dbURL string, brokers []string, schema, prefix string) error {
	commands, events, dlq := prefix+".commands", prefix+".events", prefix+".dlq"
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()

	// Set-up, once per deployment: exactly's tables, the service's own, the topics.
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+accounts+
		" (id text PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		return err
	}
	admin := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: commands, NumPartitions: 3, ReplicationFactor: 1},
		{Topic: events, NumPartitions: 3, ReplicationFactor: 1},
		{Topic: dlq, NumPartitions: 1, ReplicationFactor: 1},
	}}); err != nil {
		return err // a topic that exists already is not an error here
	}

	// Some commands, as a producer upstream would send them: the message
	// UUID is the idempotency key; cmd-1 arrives twice; cmd-4 is malformed.
	sent := [][2]string{{"cmd-1", `{"account":"acc-1","amount":10}`}, {"cmd-2", `{"account":"acc-2","amount":20}`},
		{"cmd-3", `{"account":"acc-1","amount":5}`}, {"cmd-1", `{"account":"acc-1","amount":10}`}, {"cmd-4", `{"amount":`}}

	// The worker.
	var handled, applied, duplicates, deadLettered atomic.Int64
	allHandled := make(chan struct{})
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema})
	if err != nil {
		return err
	}
	dedup, err := consumer.NewMiddleware(store, &consumer.Config{
		Scope:           "ledger-consumer",
		FingerprintFunc: dedupe.JSONFingerprint, // not JSON: dead-lettered
		Hooks: consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
			switch {
			case ev.Outcome == consumer.OutcomeApplied:
				applied.Add(1)
			case ev.Outcome == consumer.OutcomeDuplicate:
				duplicates.Add(1)
			case dedupe.IsPermanent(ev.Err):
				deadLettered.Add(1)
			default:
				return // retried: not handled yet
			}
			if handled.Add(1) == int64(len(sent)) {
				close(allHandled)
			}
		}),
	})
	if err != nil {
		return err
	}
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: prefix})
	if err != nil {
		return err
	}
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
	if err != nil {
		return err
	}
	defer pub.Close()
	poison, err := middleware.PoisonQueueWithFilter(pub, dlq, dedupe.IsPermanent)
	if err != nil {
		return err
	}
	// At start-up: the key table and the topics are where the worker looks.
	if err := dedup.Check(ctx); err != nil {
		return err
	}
	if err := kafkapubsub.CheckTopics(ctx, brokers, kafkapubsub.Security{}, commands, events, dlq); err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NewSlogLogger(nil))
	if err != nil {
		return err
	}
	router.AddMiddleware(poison,
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
			ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}.Middleware,
		middleware.Timeout(10*time.Second), dedup.Middleware, middleware.Recoverer)
	router.AddHandler("ledger-consumer", commands, sub, events, pub,
		consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			var cmd struct {
				Account string `json:"account"`
				Amount  int64  `json:"amount"`
			}
			if err := json.Unmarshal(msg.Payload, &cmd); err != nil || cmd.Account == "" || cmd.Amount <= 0 {
				return nil, fmt.Errorf("%w: want {\"account\": …, \"amount\": > 0}", dedupe.ErrInvalidPayload)
			}
			var balance int64
			if err := tx.QueryRow(ctx, "INSERT INTO "+accounts+" AS a (id, balance) VALUES ($1, $2) "+
				"ON CONFLICT (id) DO UPDATE SET balance = a.balance + $2 RETURNING balance",
				cmd.Account, cmd.Amount).Scan(&balance); err != nil {
				return nil, err
			}
			// The writes, the key and the stored outputs commit together.
			event := message.NewMessage("topped-up-"+msg.UUID, fmt.Appendf(nil, `{"account":%q,"balance":%d}`, cmd.Account, balance))
			return []*message.Message{event}, nil
		}))
	cleanupCtx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go func() { _ = store.RunCleanup(cleanupCtx, time.Hour, nil) }() // expired keys, off the hot path

	for _, c := range sent {
		msg := message.NewMessage(c[0], []byte(c[1]))
		msg.Metadata.Set(kafkapubsub.MetadataKafkaKey, c[0]) // the partition: the repeat of cmd-1 comes after cmd-1
		if err := pub.Publish(commands, msg); err != nil {
			return err
		}
	}

	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-allHandled:
	case err := <-done:
		return errors.Join(errors.New("the router stopped"), err)
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("applied %d, duplicates %d, dead-lettered %d\n", applied.Load(), duplicates.Load(), deadLettered.Load())
	rows, err := pool.Query(ctx, "SELECT id, balance FROM "+accounts+" ORDER BY id")
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var balance int64
		if err := rows.Scan(&id, &balance); err != nil {
			return err
		}
		fmt.Printf("%s: %d\n", id, balance)
	}
	return rows.Err()
}

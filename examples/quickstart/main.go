// Command quickstart is a complete worker: it applies top-up commands from
// Kafka to Postgres exactly once, emits an event per command through the
// outbox and dead-letters malformed ones, until it is interrupted.
//
//	go run ./examples/quickstart -db 'postgres://…?search_path=ledger' -brokers localhost:9092
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/worker"
)

// topUp applies one command in the worker's transaction and returns its
// event, which commits with the command's key and its effects.
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

func main() {
	db := flag.String("db", "postgres://postgres:postgres@localhost:5432/postgres?search_path=ledger", "Postgres URL; its search_path is the schema")
	brokers := flag.String("brokers", "localhost:9092", "Kafka brokers, comma-separated")
	prefix := flag.String("prefix", "ledger", "prefix of the topics (.commands, .events, .dlq)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *db, strings.Split(*brokers, ","), *prefix); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, db string, brokers []string, prefix string) error {
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Set-up, once per deployment: exactly's tables and the service's own.
	if err := migrations.Migrate(ctx, pool, nil); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL)"); err != nil {
		return err
	}
	w, err := worker.New(pool, &worker.Config{
		Scope:        "top-ups", // part of every key: keep it stable
		Brokers:      brokers,
		Topic:        prefix + ".commands",
		OutputTopic:  prefix + ".events",
		Handler:      topUp,
		CreateTopics: true,
	})
	if err != nil {
		return err
	}
	return w.Run(ctx) // until interrupted; then drains, commits and flushes the outbox
}

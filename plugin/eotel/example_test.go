package eotel_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/plugin/eotel"
	"github.com/exactly-go/exactly/worker"
)

// A worker traced whole: one line in its configuration. Each command's
// span is a child of its producer's span, and each event it returns,
// published by the outbox relay, continues the trace into the next worker.
func Example_worker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app?search_path=ledger")
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(pool, &worker.Config{
		Scope: "ledger", Topic: "ledger.commands", OutputTopic: "ledger.events", Brokers: []string{"localhost:9092"},
		Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("", msg.Payload)}, nil
		},
		Plugins: []worker.Plugin{eotel.New(nil)}, // the global TracerProvider
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = w.Run // run it until ctx ends: w.Run(ctx)
}

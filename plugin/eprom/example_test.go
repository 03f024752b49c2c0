package eprom_test

import (
	"context"
	"log"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/exactly-go/exactly/plugin/eprom"
	"github.com/exactly-go/exactly/worker"
)

// A worker with the dashboard's metrics: one line in its configuration
// gives the messages' and the relay's metrics, and the gauges of its
// outbox, its key table and its partitions, read at scrape.
func Example_worker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app?search_path=ledger")
	if err != nil {
		log.Fatal(err)
	}
	metrics := eprom.New(nil)
	if err := metrics.Register(prometheus.DefaultRegisterer); err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(pool, &worker.Config{
		Scope: "ledger", Topic: "ledger.commands", Brokers: []string{"localhost:9092"},
		Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			return nil, nil
		},
		Plugins: []worker.Plugin{metrics},
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", promhttp.Handler())
	_ = w.Run // serve /metrics, then w.Run(ctx)
}

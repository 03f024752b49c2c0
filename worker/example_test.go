package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/worker"
)

// reserve is an inventory handler: a reservation takes stock once, a
// reservation the stock cannot cover is rejected (recorded, and announced
// like the others), and a malformed command is dead-lettered.
func reserve(schema string) consumer.TxHandlerFunc {
	stock, rejections := pgx.Identifier{schema, "stock"}.Sanitize(), pgx.Identifier{schema, "rejections"}.Sanitize()
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		var cmd struct {
			SKU string `json:"sku"`
			Qty int64  `json:"qty"`
		}
		if err := json.Unmarshal(msg.Payload, &cmd); err != nil || cmd.SKU == "" || cmd.Qty <= 0 {
			return nil, dedupe.Permanent(fmt.Errorf("want {\"sku\": …, \"qty\": > 0}, got %q", msg.Payload))
		}
		outcome := "reserved"
		tag, err := tx.Exec(ctx, "UPDATE "+stock+" SET available = available - $2 WHERE sku = $1 AND available >= $2", cmd.SKU, cmd.Qty)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			outcome = "rejected"
			if _, err := tx.Exec(ctx, "INSERT INTO "+rejections+" VALUES ($1, $2)", msg.UUID, "not enough stock"); err != nil {
				return nil, err
			}
		}
		event := message.NewMessage("evt-"+msg.UUID, fmt.Appendf(nil, `{"sku":%q,"outcome":%q}`, cmd.SKU, outcome))
		return []*message.Message{event}, nil
	}
}

// An inventory worker: reservations from Kafka change stock rows exactly
// once, an event per reservation leaves through the outbox, rejections are
// recorded and the malformed command is dead-lettered. Every command is sent
// twice; each is applied once.
func Example() {
	pool, schema, drop := pgtest.ExampleDB()
	defer drop()
	broker, _ := kafkatest.Resolve()
	prefix := kafkatest.Name("inventory")
	_, _ = pool.Exec(context.Background(), "CREATE TABLE "+schema+".stock (sku text PRIMARY KEY, available bigint NOT NULL);"+
		"CREATE TABLE "+schema+".rejections (command text PRIMARY KEY, reason text NOT NULL);"+
		"INSERT INTO "+schema+".stock VALUES ('sku-1', 10), ('sku-2', 3)")

	// The wiring.
	ctx, stop := context.WithCancel(context.Background())
	var handled, deadLettered atomic.Int64
	w, err := worker.New(pool, &worker.Config{
		Scope: "inventory", Schema: schema, Brokers: broker.Addrs, Migrate: true, CreateTopics: true,
		Topic: prefix + ".commands", OutputTopic: prefix + ".events", DeadLetterTopic: prefix + ".dlq",
		Handler: reserve(schema), Tables: []string{"stock", "rejections"},
		Hooks: consumer.HooksFunc(func(_ context.Context, ev consumer.Event) {
			if dedupe.IsPermanent(ev.Err) {
				deadLettered.Add(1)
			}
			if ev.Outcome == consumer.OutcomeApplied || ev.Outcome == consumer.OutcomeDuplicate || dedupe.IsPermanent(ev.Err) {
				if handled.Add(1) == 10 {
					stop() // every command handled (an example ends; a service runs until it is stopped)
				}
			}
		}),
	})
	if err != nil {
		panic(err)
	}
	go send(w.Running(), broker.Addrs, prefix+".commands")
	if err := w.Run(ctx); err != nil {
		panic(err)
	}

	var sku1, sku2, rejected, events int64
	_ = pool.QueryRow(context.Background(), "SELECT (SELECT available FROM "+schema+".stock WHERE sku = 'sku-1'), "+
		"(SELECT available FROM "+schema+".stock WHERE sku = 'sku-2'), (SELECT count(*) FROM "+schema+".rejections), "+
		"(SELECT count(*) FROM "+schema+".exactly_outbox WHERE status = 'PUBLISHED')").Scan(&sku1, &sku2, &rejected, &events)
	fmt.Printf("sku-1: %d, sku-2: %d, rejections: %d, events published: %d, dead letters: %d\n", sku1, sku2, rejected, events, deadLettered.Load())
	// Output:
	// sku-1: 7, sku-2: 1, rejections: 1, events published: 3, dead letters: 4
}

// send publishes every command twice, as a producer that retries would.
func send(running <-chan struct{}, brokers []string, topic string) {
	<-running
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	for _, c := range [][2]string{{"r-1", `{"sku":"sku-1","qty":3}`}, {"r-2", `{"sku":"sku-2","qty":2}`},
		{"r-3", `{"sku":"sku-2","qty":2}`}, {"r-4", `{"sku":"sku-2"`}, {"r-5", `{"sku":"sku-2","qty":0}`}} {
		for range 2 {
			msg := message.NewMessage(c[0], []byte(c[1]))
			msg.Metadata.Set(kafkapubsub.MetadataKafkaKey, "one-partition") // in order
			if err := pub.Publish(topic, msg); err != nil {
				panic(err)
			}
		}
	}
}

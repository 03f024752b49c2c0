package dbloss_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
)

// A command moves amount into account; its message UUID is its key.
type command struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// mode is how a ledger consumes: one message at a time per partition,
// several keys of a partition at once, or batches.
type mode string

const (
	perMessage mode = "per_message"
	keyOrdered mode = "key_ordered"
	batch      mode = "batch"
)

var modes = []mode{perMessage, keyOrdered, batch}

// ledger is one consumer of the topic: its schema (keys, positions,
// accounts and an entry per application of a command) and its group.
type ledger struct {
	mode      mode
	positions bool
	schema    string
	group     string
}

func (l ledger) String() string {
	if l.positions {
		return string(l.mode) + " with positions"
	}
	return string(l.mode) + " without positions"
}

// ledgers returns a ledger for each mode, with and without positions.
func ledgers() []ledger {
	var out []ledger
	for _, m := range modes {
		for _, pos := range []bool{false, true} {
			name := string(m) + "_nopos"
			if pos {
				name = string(m) + "_pos"
			}
			out = append(out, ledger{mode: m, positions: pos, schema: name, group: kafkatest.Name("g_" + name)})
		}
	}
	return out
}

// create migrates l's schema and creates its tables on pool.
func (l ledger) create(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: l.schema}); err != nil {
		t.Fatal(err)
	}
	s := pgx.Identifier{l.schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+s+".accounts (id text PRIMARY KEY, balance bigint NOT NULL); "+
		"CREATE TABLE "+s+".entries (uuid text NOT NULL, account text NOT NULL, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
}

func (l ledger) table(name string) string { return pgx.Identifier{l.schema, name}.Sanitize() }

// apply applies commands in tx: one entry each, and the accounts' balances.
func (l ledger) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	uuids := make([]string, len(msgs))
	accounts := make([]string, len(msgs))
	amounts := make([]int64, len(msgs))
	for i, m := range msgs {
		var c command
		if err := json.Unmarshal(m.Payload, &c); err != nil {
			return err
		}
		uuids[i], accounts[i], amounts[i] = m.UUID, c.Account, c.Amount
	}
	_, err := tx.Exec(ctx, `WITH e AS (
    INSERT INTO `+l.table("entries")+` (uuid, account, amount) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
)
INSERT INTO `+l.table("accounts")+` AS a (id, balance)
SELECT account, sum(amount) FROM unnest($2::text[], $3::bigint[]) AS u(account, amount) GROUP BY account ORDER BY account
ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance`, uuids, accounts, amounts)
	return err
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs l's consumer on pool until the returned function is called.
func (l ledger) start(t *testing.T, pool *pgxpool.Pool, brokers []string, topic string) (stop func()) {
	t.Helper()
	store, err := pgstore.New(pool, &pgstore.Config{Schema: l.schema, RetryBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &kafkapubsub.SubscriberConfig{
		Brokers: brokers, ConsumerGroup: l.group, MaxInFlight: 1,
		NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond, CommitInterval: 50 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, DrainTimeout: 2 * time.Second,
		Logger: quiet(),
	}
	switch l.mode {
	case keyOrdered:
		cfg.MaxInFlight, cfg.KeyOrdered = 8, true
	case batch:
		cfg.MaxInFlight = 64
	}
	if l.positions {
		cfg.Positions = store.Positions()
	}
	sub, err := kafkapubsub.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if l.mode == batch {
		bc, err := consumer.NewBatchConsumer(store, func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
			return nil, l.apply(ctx, tx, msgs)
		}, &consumer.BatchConfig{Config: consumer.Config{Scope: "ledger", Logger: quiet(), MaxAttempts: -1}, MaxSize: 50})
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- bc.Subscribe(ctx, sub, topic) }()
	} else {
		mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "ledger", Logger: quiet(), MaxAttempts: -1})
		if err != nil {
			t.Fatal(err)
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(mw.Middleware)
		h := consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			return nil, l.apply(ctx, tx, []*message.Message{msg})
		})
		router.AddNoPublisherHandler("ledger", topic, sub, func(msg *message.Message) error { _, err := h(msg); return err })
		go func() { done <- router.Run(ctx) }()
		select {
		case <-router.Running():
		case err := <-done:
			t.Fatalf("%s: router: %v", l, err)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			_ = sub.Close()
		})
	}
}

// produce writes n commands on accounts to topic, keyed by account.
func produce(t *testing.T, brokers []string, topic string, n int, rnd *rand.Rand) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		c := command{Account: fmt.Sprintf("acc-%02d", rnd.IntN(24)), Amount: 1 + rnd.Int64N(1000)}
		b, _ := json.Marshal(c)
		msgs[i] = kafka.Message{Key: []byte(c.Account), Value: b,
			Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(watermill.NewUUID())}}}
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 100}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// waitCommitted waits until every ledger's group has committed every record
// of topic to Kafka and, with positions, saved them in pool's database; it
// reports false for a ledger that did not within d.
func waitCommitted(t *testing.T, pool *pgxpool.Pool, ls []ledger, topic string, partitions int, d time.Duration) bool {
	t.Helper()
	end := kafkatest.EndOffsets(t, topic, partitions)
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	for _, l := range ls {
		positions, err := pgstore.NewPositions(pool, &pgstore.PositionsConfig{Schema: l.schema})
		if err != nil {
			t.Fatal(err)
		}
		done := func() bool {
			c := kafkatest.CommittedOffsets(t, l.group, topic, partitions)
			var saved map[int]int64
			if l.positions {
				var err error
				if saved, err = positions.Load(context.Background(), l.group, topic, parts); err != nil {
					return false
				}
			}
			for p, o := range end {
				if c[p] != o || (l.positions && saved[p] != o) {
					return false
				}
			}
			return true
		}
		for deadline := time.Now().Add(d); !done(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%s: not every record committed after %v", l, d)
				return false
			}
		}
	}
	return true
}

// entries counts l's applied entries on pool.
func (l ledger) entries(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+l.table("entries")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// audit compares l's ledger on pool with every command of topic: how many
// commands were never applied, how many more than once, and how many
// accounts' balances differ from the sum of their commands.
func (l ledger) audit(t *testing.T, pool *pgxpool.Pool, records []kafka.Message) (lost, doubled, wrongBalances int) {
	t.Helper()
	ctx := context.Background()
	applied := map[string]int{}
	rows, err := pool.Query(ctx, "SELECT uuid, count(*) FROM "+l.table("entries")+" GROUP BY uuid")
	if err != nil {
		t.Fatal(err)
	}
	var uuid string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&uuid, &n}, func() error { applied[uuid] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for _, r := range records {
		var c command
		if err := json.Unmarshal(r.Value, &c); err != nil {
			t.Fatal(err)
		}
		want[c.Account] += c.Amount
		var id string
		for _, h := range r.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				id = string(h.Value)
			}
		}
		switch applied[id] {
		case 0:
			lost++
		case 1:
		default:
			doubled++
		}
	}
	got := map[string]int64{}
	rows, err = pool.Query(ctx, "SELECT id, balance FROM "+l.table("accounts"))
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var bal int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &bal}, func() error { got[id] = bal; return nil }); err != nil {
		t.Fatal(err)
	}
	for acc, w := range want {
		if got[acc] != w {
			wrongBalances++
		}
	}
	return lost, doubled, wrongBalances
}

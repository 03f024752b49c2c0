package kgopubsub_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/worker"
)

// A fleet switched from kafka-go to franz-go by starting a franz-go worker
// while a kafka-go one still runs the group: the broker refuses the new
// member (INCONSISTENT_GROUP_PROTOCOL: the group assigns with range, which
// franz-go's cooperative-sticky does not share), and the worker says so in
// its Health ("consumer") instead of idling as healthy. The switch that
// works, as docs/transports.md says: once the last kafka-go
// worker stops, the franz-go one joins, and every command is applied
// once, none lost (offsets and positions are the group's and the
// database's, whichever transport wrote them).
func TestWorkerSwitchFromKafkaGo(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	ctx := context.Background()
	commands, dlq, group := kafkatest.Topic(t, 2), kafkatest.Topic(t, 1), kafkatest.Name("g")
	applied := appliedTable(t, db)
	apply := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		return nil, applyOnce(ctx, tx, applied, msg)
	}
	start := func(tr worker.Transport) (*worker.Worker, func()) {
		wk, err := worker.New(db.Pool, &worker.Config{Scope: "test", Schema: db.Schema, Brokers: kafkatest.Brokers(t), Topic: commands,
			DeadLetterTopic: dlq, Group: group, Handler: apply, Tables: []string{"applied"}, SessionTimeout: 6 * time.Second,
			Logger: quietLogger(), StartupBackoff: 200 * time.Millisecond, Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- wk.Run(wctx) }()
		var stopped bool
		stop := func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
		t.Cleanup(stop)
		return wk, stop
	}
	sent := 0
	send := func(n int) {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(uuid.NewString(), []byte(fmt.Sprint(sent+i)))
		}
		publish(t, commands, msgs...)
		sent += n
	}
	count := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	_, stopOld := start(nil) // kafka-go, the default
	send(10)
	testenv.WaitFor(t, time.Minute, "the kafka-go worker to apply the first commands", func() bool { return count() == sent })

	franz, _ := start(kgopubsub.Transport{})
	<-franz.Running()
	var health error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if health = franz.Health(ctx); health != nil && strings.Contains(health.Error(), "consumer") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the franz-go worker's Health is %v while the broker refuses it the group the kafka-go worker runs, want \"consumer\" down", health)
		}
	}
	t.Logf("the franz-go worker's Health while refused: %v", health)
	send(10)
	testenv.WaitFor(t, time.Minute, "the kafka-go worker to apply the commands sent meanwhile", func() bool { return count() == sent })

	stopOld()
	send(10)
	testenv.WaitFor(t, 2*time.Minute, "the franz-go worker to join and apply the rest, healthy", func() bool {
		return count() == sent && franz.Health(ctx) == nil
	})
	var once, twice int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE n > 1) FROM "+applied).
		Scan(&once, &twice); err != nil || once != sent || twice != 0 {
		t.Fatalf("applied once %d, more than once %d (%v); want %d and 0", once, twice, err, sent)
	}
}

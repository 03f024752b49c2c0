package kgopubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/kgopubsub"
)

// Read committed (the default): the records of an aborted transaction are
// never delivered, those of a committed one are, and a Subscriber with
// ReadUncommitted gets both.
func TestReadCommitted(t *testing.T) {
	brokers := kafkatest.RealParallel(t)
	topic := kafkatest.Topic(t, 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(kafkatest.Name("tx")), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for _, txn := range []struct {
		value  string
		commit kgo.TransactionEndTry
	}{{"aborted", kgo.TryAbort}, {"committed", kgo.TryCommit}} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(txn.value)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, txn.commit); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		isolation kafkapubsub.Isolation
		want      map[string]int
	}{
		{kafkapubsub.ReadCommitted, map[string]int{"committed": 3}},
		{kafkapubsub.ReadUncommitted, map[string]int{"aborted": 3, "committed": 3}},
	} {
		group := kafkatest.Name("g")
		sub := subscriber(t, kgopubsub.SubscriberConfig{SubscriberConfig: kafkapubsub.SubscriberConfig{
			Brokers: brokers, ConsumerGroup: group, Isolation: c.isolation}})
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		total := 0
		for _, n := range c.want {
			total += n
		}
		for i := 0; i < total; i++ {
			select {
			case m := <-ch:
				got[string(m.Payload)]++
				m.Ack()
			case <-time.After(time.Minute):
				t.Fatalf("isolation %d: got %v in a minute, want %v", c.isolation, got, c.want)
			}
		}
		// Everything up to the last committed record is committed: the
		// hidden records below it included.
		testenv.WaitFor(t, time.Minute, "the group to commit past the last record delivered", func() bool {
			return kafkatest.CommittedOffsets(t, group, topic, 1)[0] >= 7
		})
		_ = sub.Close()
		for m := range ch {
			got[string(m.Payload)]++
		}
		if len(got) != len(c.want) || got["committed"] != c.want["committed"] || got["aborted"] != c.want["aborted"] {
			t.Fatalf("isolation %d delivered %v, want %v", c.isolation, got, c.want)
		}
	}
}

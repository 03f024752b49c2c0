package subtest

import (
	"context"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// A member that lost its partition without knowing it (cut off from Kafka
// past its session) and saves the partition's position late, below what the
// partition's new owner saved since, moves no position backwards: the
// owner's next save finds the database where it left it, so the owner
// neither takes the database for one that went back nor delivers anything
// again. The late save is the one that member's Subscriber makes: its
// offset one below the owner's, its expected position the one it saved
// before.
func PositionsLateSave(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(t, 1), kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	position := func() int64 {
		t.Helper()
		got, err := positions.Load(ctx, group, topic, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := got[0]; ok {
			return p
		}
		return -1
	}
	ProduceKeyed(t, brokers, topic, 10, 2)
	d, stop := consumeAll(t, tr, &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: Logger()}, topic)
	defer stop()
	testenv.WaitFor(t, time.Minute, "the owner to save the position past the first records", func() bool { return position() == 10 })

	// The expelled member's late save: it had saved 8, and then applied 8.
	if _, err := positions.Save(ctx, group, topic, map[int]int64{0: 9}, map[int]int64{0: 8}); err != nil {
		t.Fatal(err)
	}
	if p := position(); p != 10 {
		t.Errorf("the late save moved the position from 10 to %d", p)
	}
	ProduceKeyed(t, brokers, topic, 10, 2)
	testenv.WaitFor(t, time.Minute, "the owner to consume and save the new records", func() bool { return position() == 20 })
	stop()
	if got, want := d.of(0), offsetRange(0, 20); !slicesEqual(got, want) {
		t.Fatalf("the owner delivered %v, want %v once each", got, want)
	}
}

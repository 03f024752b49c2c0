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

// A save of a partition that another member claimed since the member
// claimed it stores nothing, and Kafka then decides who owns it. The
// member here is the transport's Subscriber; the other is the test, which
// claims the partition in the database as a member just assigned it does
// (pgstore.Positions.Claim) while the Subscriber holds a message, though
// Kafka never assigned the partition to anyone else (a member that left,
// whose claim reached the database late). The Subscriber acks the
// message: its save must be refused, and since Kafka says the partition is
// still the Subscriber's, the Subscriber must claim it again and save: the
// position moves to 6 only under a claim above the test's, and then does.
func PositionsClaimedByAnother(t *testing.T, tr Transport) {
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
	// where reads the position and the claim's epoch in one snapshot (-1
	// for none).
	where := func() (pos, epoch int64) {
		t.Helper()
		err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT next_offset FROM `+db.Table("exactly_positions")+` WHERE consumer_group = $1 AND topic = $2 AND partition = 0), -1),
       coalesce((SELECT epoch FROM `+db.Table("exactly_positions_claims")+` WHERE consumer_group = $1 AND topic = $2 AND partition = 0), -1)`, group, topic).Scan(&pos, &epoch)
		if err != nil {
			t.Fatal(err)
		}
		return pos, epoch
	}
	cfg := &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: positions,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: Logger()}
	ProduceKeyed(t, brokers, topic, 5, 1)
	sub, err := tr.NewSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		for m := range ch {
			if OffsetOf(m) == 5 {
				close(held)
				<-release
			}
			m.Ack()
		}
	}()
	testenv.WaitFor(t, time.Minute, "the member to save the first records", func() bool { p, _ := where(); return p == 5 })
	ProduceKeyed(t, brokers, topic, 1, 1)
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("offset 5 was not delivered in a minute")
	}
	_, theirs, err := positions.Claim(ctx, group, topic, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	testenv.WaitFor(t, time.Minute, "the member to claim the partition again and save position 6", func() bool {
		p, epoch := where()
		if p == 6 && epoch == theirs[0] {
			t.Fatalf("the member saved a partition another member had claimed: position 6 under the other's claim (epoch %d)", epoch)
		}
		return p == 6
	})
}

package subtest

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// claimSignal is pgstore.Positions that tells when its first Claim starts.
type claimSignal struct {
	*pgstore.Positions
	once    sync.Once
	claimed chan struct{}
}

func (c *claimSignal) Claim(ctx context.Context, group, topic string, partitions []int) (map[int]int64, map[int]int64, error) {
	c.once.Do(func() { close(c.claimed) })
	return c.Positions.Claim(ctx, group, topic, partitions)
}

// A member closes while its claim is on its way to a slow database (a
// link with seconds of latency): the claim reaches the database after the
// member left and after the partition's next owner claimed it. The next
// owner, a healthy member of the group, must still save and commit the
// partition: every position reaches the end of the records produced after.
func PositionsLateClaimOfAClosedMember(t *testing.T, tr Transport) {
	kafkatest.RequireReal(t)
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	const partitions = 2
	topic, group := kafkatest.Topic(t, partitions), kafkatest.Name("g")
	db := pgtest.New(t)
	ctx := context.Background()
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	positions := store.Positions()
	cfg := func(p kafkapubsub.Positions) *kafkapubsub.SubscriberConfig {
		return &kafkapubsub.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, Positions: p,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, CommitInterval: 20 * time.Millisecond, Logger: Logger()}
	}
	atEnd := func() bool {
		end := kafkatest.EndOffsets(t, topic, partitions)
		maps.DeleteFunc(end, func(_ int, o int64) bool { return o == 0 })
		got, err := positions.Load(ctx, group, topic, []int{0, 1})
		if err != nil {
			t.Fatal(err)
		}
		return maps.Equal(got, end)
	}
	ProduceKeyed(t, brokers, topic, 20, 8)
	_, stopB := consumeAll(t, tr, cfg(positions), topic)
	defer stopB()
	testenv.WaitFor(t, time.Minute, "the first member to save every position", atEnd)

	// The second member's database is lateBy away: longer than the group
	// takes to give the partition back to the first member (KIP-848's
	// broker assigns at its heartbeat interval, 5 s at least).
	const lateBy = 15 * time.Second
	hole := pgtest.NewBlackHole(t)
	pool := hole.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1; c.MinConns = 1 })
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	slow, err := pgstore.NewPositions(pool, &pgstore.PositionsConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	// Its connection has claimed before (its statement is prepared), so a
	// claim is one message on the way.
	if _, _, err := slow.Claim(ctx, group+"-warm", topic, []int{0}); err != nil {
		t.Fatal(err)
	}
	hole.Delay(lateBy)
	sig := &claimSignal{Positions: slow, claimed: make(chan struct{})}
	subA, err := tr.NewSubscriber(cfg(sig))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subA.Subscribe(ctx, topic); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sig.claimed:
	case <-time.After(time.Minute):
		t.Fatal("the second member claimed nothing in a minute")
	}
	// The claim is sent within moments (it is one message); Close must not
	// cancel it before it leaves. (Not a wait for a condition: the bytes on
	// their way are not observable.)
	time.Sleep(500 * time.Millisecond)
	// It closes with its claim on the way; the first member takes the
	// partition back and claims it.
	closing := time.Now()
	if err := subA.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(closing))
	defer func() {
		rows, _ := db.Pool.Query(ctx, "SELECT partition, epoch, claimed_at FROM "+db.Table("exactly_positions_claims")+" WHERE consumer_group = $1 ORDER BY partition", group)
		for rows.Next() {
			var p int
			var e int64
			var at time.Time
			_ = rows.Scan(&p, &e, &at)
			t.Logf("claim %d epoch %d at %v", p, e, at)
		}
		rows.Close()
	}()
	testenv.WaitFor(t, time.Minute, "the closed member's claim to reach the database", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_positions_claims")+" WHERE consumer_group = $1 AND claimed_at > $2", group, closing.Add(lateBy-2*time.Second)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	ProduceKeyed(t, brokers, topic, 20, 8)
	testenv.WaitFor(t, time.Minute, "every position to reach the end after the second member left", atEnd)
}

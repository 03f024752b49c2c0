package consumer_test

import (
	"testing"
	"time"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
)

// The answer to a message's COMMIT is lost: the store finds the write as
// its own, and the hooks count the message as applied, not as a duplicate.
func TestCommitAnswerLostCountsAsApplied(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	d := pgtest.NewCommitDropper(t)
	w.useStore(d.Pool(t))
	exp, recs := commands(1)
	w.produce(recs...)
	d.Arm()
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks})
	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(exp)
	if d.Dropped() != 1 || hooks.get(consumer.OutcomeApplied) != 1 || hooks.get(consumer.OutcomeDuplicate) != 0 {
		t.Fatalf("answers dropped %d; hooks %v: want 1 applied, no duplicate", d.Dropped(), hooks.n)
	}
}

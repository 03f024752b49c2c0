package consumer_test

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// A Kafka outage mid-stream: the broker freezes for longer than the group's
// session timeout, then comes back. The subscriber backs off, rejoins and
// carries on: every message applied exactly once, none lost.
func TestKafkaOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker of its own")
	}
	t.Parallel()
	own := kafkatest.StartOwn(t, nil)
	addr, pid := own.Addr, own.PID
	w := newWorldOn(t, []string{addr}, 3)
	exp, recs := commands(400)
	w.produce(recs...)
	group := "outage-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	slow := func(*message.Message) error { time.Sleep(5 * time.Millisecond); return nil }
	w.startRouter(routerOpts{group: group, handler: w.handler(slow)})
	testenv.WaitFor(t, time.Minute, "the first applications", func() bool { return w.applied() >= 40 })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // longer than the 6s session timeout
	stalled := w.applied()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	w.waitCaughtUp(group, 3*time.Minute)
	w.assertExactlyOnce(exp)
	if stalled >= len(exp) {
		t.Fatalf("the outage did not interrupt the stream (%d applied during it)", stalled)
	}
}

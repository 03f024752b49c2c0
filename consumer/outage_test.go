package consumer_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// ownBroker starts a real Kafka broker of this test's own (scripts/kafka.sh
// on other ports), so that it can be frozen without disturbing other tests.
// It returns the broker's address and its process id.
func ownBroker(t *testing.T) (string, int) {
	t.Helper()
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s is not installed: the Kafka outage test runs a broker of its own", tool)
		}
	}
	script, err := filepath.Abs("../scripts/kafka.sh")
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(t.TempDir(), "kafka")
	// Fresh ports each time: kafka-go pools connections by address, and a
	// pooled connection to an earlier broker on the same port would be stale.
	env := append(os.Environ(), "KAFKA_PORT="+freePort(t), "KAFKA_CONTROLLER_PORT="+freePort(t), "KAFKA_RUN_DIR="+run, "KAFKA_HEAP=384m")
	start := exec.Command("bash", script, "start")
	start.Env = env
	out, err := start.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		testenv.Missing(t, "could not start a second Kafka broker: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		stop := exec.Command("bash", script, "stop")
		stop.Env = env
		_ = stop.Run()
	})
	pidText, err := os.ReadFile(filepath.Join(run, "broker.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), pid
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// A Kafka outage mid-stream: the broker freezes for longer than the group's
// session timeout, then comes back. The subscriber backs off, rejoins and
// carries on: every message applied exactly once, none lost.
func TestKafkaOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker of its own")
	}
	t.Parallel()
	addr, pid := ownBroker(t)
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

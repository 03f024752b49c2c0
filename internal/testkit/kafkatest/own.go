package kafkatest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// OwnBroker is a Kafka broker that belongs to one test.
type OwnBroker struct {
	Addr string // host:port of its listener
	PID  int    // its JVM when it started, to freeze or kill

	// Restart is the command that stops the broker and starts it again on
	// its data (topics, records and committed offsets survive) on the same
	// ports, returning once it serves: scripts/kafka.sh restart with the
	// broker's environment.
	Restart []string

	script string
	env    []string
	run    string
}

// StartOwn starts a real Kafka broker of the test's own (scripts/kafka.sh on
// fresh ports and a run directory of its own), so that the test can freeze,
// kill, restart or reconfigure it without disturbing other tests; the
// broker stops at the end of the test. props, when set, returns
// server.properties lines to add, given the broker's port and its
// controller's port. Where Java or Maven is missing the test skips (or
// fails under CI).
func StartOwn(t testing.TB, props func(port, controllerPort int) string) OwnBroker {
	t.Helper()
	b := PrepareOwn(t, props)
	b.Start(t)
	return *b
}

// PrepareOwn is StartOwn without the start: it chooses the ports and the run
// directory, so that Addr and Restart are known before the broker runs;
// Start starts it.
func PrepareOwn(t testing.TB, props func(port, controllerPort int) string) *OwnBroker {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("kafkatest: cannot locate scripts/kafka.sh")
	}
	b := &OwnBroker{script: filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "kafka.sh"), run: filepath.Join(t.TempDir(), "kafka")}
	// Fresh ports each time: kafka-go pools connections by address, and a
	// pooled connection to an earlier broker on the same port would be stale.
	port, cport := FreePort(t), FreePort(t)
	b.env = []string{fmt.Sprintf("KAFKA_PORT=%d", port), fmt.Sprintf("KAFKA_CONTROLLER_PORT=%d", cport), "KAFKA_RUN_DIR=" + b.run, "KAFKA_HEAP=384m"}
	if props != nil {
		b.env = append(b.env, "KAFKA_PROPERTIES="+props(port, cport))
	}
	b.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	b.Restart = append(append([]string{"env"}, b.env...), "bash", b.script, "restart")
	return b
}

// Start starts the broker PrepareOwn made ready and stops it at the end of
// the test.
func (b *OwnBroker) Start(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s is not installed: the test runs a Kafka broker of its own", tool)
		}
	}
	env := append(os.Environ(), b.env...)
	start := exec.Command("bash", b.script, "start")
	start.Env = env
	out, err := start.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		testenv.Missing(t, "could not start a Kafka broker of the test's own: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		stop := exec.Command("bash", b.script, "stop")
		stop.Env = env
		_ = stop.Run()
	})
	if got := strings.TrimSpace(string(out)); got != b.Addr {
		t.Fatalf("kafkatest: kafka.sh start printed %q, want %q", got, b.Addr)
	}
	pid, err := b.RunningPID()
	if err != nil {
		t.Fatal(err)
	}
	b.PID = pid
}

// RunningPID is the pid of the broker's JVM now (a restart changes it).
func (b *OwnBroker) RunningPID() (int, error) {
	text, err := os.ReadFile(filepath.Join(b.run, "broker.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(text)))
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

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
	PID  int    // its JVM, to freeze or kill
}

// StartOwn starts a real Kafka broker of the test's own (scripts/kafka.sh on
// fresh ports and a run directory of its own), so that the test can freeze,
// kill or reconfigure it without disturbing other tests; the broker stops
// at the end of the test. props, when set, returns server.properties lines
// to add, given the broker's port and its controller's port. Where Java or
// Maven is missing the test skips (or fails under CI).
func StartOwn(t testing.TB, props func(port, controllerPort int) string) OwnBroker {
	t.Helper()
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s is not installed: the test runs a Kafka broker of its own", tool)
		}
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("kafkatest: cannot locate scripts/kafka.sh")
	}
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "kafka.sh")
	run := filepath.Join(t.TempDir(), "kafka")
	// Fresh ports each time: kafka-go pools connections by address, and a
	// pooled connection to an earlier broker on the same port would be stale.
	port, cport := FreePort(t), FreePort(t)
	env := append(os.Environ(), fmt.Sprintf("KAFKA_PORT=%d", port), fmt.Sprintf("KAFKA_CONTROLLER_PORT=%d", cport),
		"KAFKA_RUN_DIR="+run, "KAFKA_HEAP=384m")
	if props != nil {
		env = append(env, "KAFKA_PROPERTIES="+props(port, cport))
	}
	start := exec.Command("bash", script, "start")
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
	return OwnBroker{Addr: strings.TrimSpace(string(out)), PID: pid}
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

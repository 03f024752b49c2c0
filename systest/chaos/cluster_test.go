package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/systest/pgcluster"
)

// moduleRoot is the repository's root, the directory of go.work (the suite
// builds ./examples/ledger-consumer, a module of the workspace).
func moduleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if w := string(bytes.TrimSpace(out)); err != nil || w == "" || w == "off" {
		t.Fatalf("go env GOWORK: %q, %v: the chaos suite runs in the repository's workspace (go.work)", w, err)
	}
	return filepath.Dir(string(bytes.TrimSpace(out)))
}

// newPGCluster starts the suite's PostgreSQL cluster in base/pgdata.
func newPGCluster(t testing.TB, base string) *pgcluster.Cluster {
	t.Helper()
	_ = os.Chmod(base, 0o755)
	c := pgcluster.Init(t, pgcluster.NewestBin(), base, "pgdata", "max_connections = 200\nfsync = off\nfull_page_writes = off\nshared_buffers = 64MB\n")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return c
}

// broker is a Kafka broker of the suite's own, run by scripts/kafka.sh on
// its own ports and run directory.
type broker struct {
	script string
	env    []string
	port   int
	run    string
}

// requireTools skips (fails under CI=true) when the suite cannot run its
// own servers.
func requireTools(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("java"); err != nil {
		testenv.Missing(t, "chaos: java not found: the suite runs its own Kafka broker through scripts/kafka.sh (Java 17+)")
	}
	pgcluster.Require(t, "chaos", pgcluster.NewestBin())
}

// startBroker starts the run's broker. A port found free can be taken
// before the broker binds it (by another test's outgoing connection, on a
// busy machine): the broker is then started again on other ports, in a
// run directory of its own.
func startBroker(root, base string) (*broker, error) {
	var err error
	for attempt := range 3 {
		run := filepath.Join(base, "kafka")
		if attempt > 0 {
			run += strconv.Itoa(attempt)
		}
		b := &broker{script: filepath.Join(root, "scripts", "kafka.sh"), run: run}
		if b.port, err = pgcluster.FreePort(); err != nil {
			return nil, err
		}
		var cport int
		if cport, err = pgcluster.FreePort(); err != nil {
			return nil, err
		}
		b.env = append(os.Environ(), "KAFKA_PORT="+strconv.Itoa(b.port), "KAFKA_CONTROLLER_PORT="+strconv.Itoa(cport),
			"KAFKA_RUN_DIR="+b.run, "KAFKA_HEAP=384m", "KAFKA_START_TIMEOUT=180",
			// Fewer internal partitions: a restart after kill -9 recovers each.
			"KAFKA_PROPERTIES=offsets.topic.num.partitions=3\ntransaction.state.log.num.partitions=3")
		if err = b.do("start"); err == nil || !strings.Contains(err.Error(), "Address already in use") {
			return b, err
		}
		_ = b.do("stop")
	}
	return nil, err
}

func (b *broker) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

func (b *broker) do(verb string) error {
	cmd := exec.Command(b.script, verb)
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("chaos: kafka.sh %s: %v\n%s", verb, err, out)
	}
	return nil
}

func (b *broker) pid() int {
	raw, err := os.ReadFile(filepath.Join(b.run, "broker.pid"))
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	return p
}

func (b *broker) pause(d time.Duration) {
	p := b.pid()
	if p == 0 {
		return
	}
	_ = syscall.Kill(p, syscall.SIGSTOP)
	time.Sleep(d) // the fault itself: the broker is frozen this long
	_ = syscall.Kill(p, syscall.SIGCONT)
}

// worker is one ledger worker process slot: the supervisor starts it again
// after every exit, as a service manager would.
type worker struct {
	id    int
	extra []string // arguments of this worker's own (its mode)
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	// killed is set before the suite kills the process, so its exit is not
	// counted as one of its own.
	killed bool
	// stopped while SIGSTOPped: not a kill target.
	stopped bool
	starts  int
	exitErr error
	logs    []string
}

type workers struct {
	bin, dir string
	args     []string
	batch    int // see options.batch
	// transport and static are options.transport and options.static.
	transport string
	static    bool
	mu        sync.Mutex
	all       []*worker
	// exits are the exits that nobody asked for, with their log tails.
	exits    []string
	stopping bool
	// restarts counts the starts after the first of every slot.
	restarts *atomic.Int64
	wg       sync.WaitGroup
}

// respawn starts w again after d, unless the run is ending.
func (ws *workers) respawn(w *worker, d time.Duration) {
	ws.wg.Add(1)
	time.AfterFunc(d, func() {
		defer ws.wg.Done()
		ws.mu.Lock()
		defer ws.mu.Unlock()
		if ws.stopping || w.alive() {
			return
		}
		if err := ws.start(w); err == nil && ws.restarts != nil {
			ws.restarts.Add(1)
		}
	})
}

// start launches w's process and a goroutine that waits for it.
func (ws *workers) start(w *worker) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.starts++
	log := filepath.Join(ws.dir, fmt.Sprintf("worker-%d.%d.log", w.id, w.starts))
	f, err := os.Create(log)
	if err != nil {
		return err
	}
	cmd := exec.Command(ws.bin, append(slices.Clone(ws.args), w.extra...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("chaos: start worker: %w", err)
	}
	w.cmd, w.done, w.killed, w.stopped = cmd, make(chan struct{}), false, false
	w.logs = append(w.logs, log)
	done, n := w.done, w.starts
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		err := cmd.Wait()
		f.Close()
		w.mu.Lock()
		w.exitErr = err
		killed := w.killed
		w.mu.Unlock()
		close(done)
		if !killed {
			ws.mu.Lock()
			ws.exits = append(ws.exits, fmt.Sprintf("worker %d (start %d) exited on its own: %v: %s", w.id, n, err, lastLines(log, 1)))
			ws.mu.Unlock()
			ws.respawn(w, time.Second) // as a service manager would
		}
	}()
	return nil
}

func (w *worker) pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cmd == nil || w.cmd.Process == nil {
		return 0
	}
	return w.cmd.Process.Pid
}

func (w *worker) alive() bool {
	w.mu.Lock()
	done := w.done
	w.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (w *worker) kill() {
	w.mu.Lock()
	w.killed = true
	cmd, done := w.cmd, w.done
	w.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stopAll ends every worker gracefully (SIGTERM, then SIGKILL after 40 s).
func (ws *workers) stopAll() {
	ws.mu.Lock()
	ws.stopping = true
	all := append([]*worker(nil), ws.all...)
	ws.mu.Unlock()
	for _, w := range all {
		w.mu.Lock()
		w.killed = true
		cmd, done := w.cmd, w.done
		w.mu.Unlock()
		if cmd == nil {
			continue
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
	}
	ws.wg.Wait()
}

func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// tcpPorts returns the local ports of pid's TCP sockets (through the socket
// inodes of its file descriptors and /proc/net/tcp{,6}).
func tcpPorts(pid int) map[int]bool {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			if i := strings.LastIndexByte(fs[1], ':'); i >= 0 {
				if p, err := strconv.ParseInt(fs[1][i+1:], 16, 32); err == nil {
					ports[int(p)] = true
				}
			}
		}
		f.Close()
	}
	return ports
}

// modeArgs returns the mode arguments of worker id: batch mode for odd ids
// when the run has batches, so both modes share the group.
func (ws *workers) modeArgs(id int) []string {
	var args []string
	if ws.batch > 0 && id%2 == 1 {
		args = append(args, "--batch", strconv.Itoa(ws.batch))
	}
	if ws.transport == "franz-go" {
		args = append(args, "--transport", "franz-go")
		if ws.static {
			args = append(args, "--instance-id", fmt.Sprintf("chaos-%d", id))
		}
	}
	return args
}

// modes describes the workers' modes for the summary line.
func (ws *workers) modes() string {
	m := "per-message"
	if ws.batch > 0 {
		m = fmt.Sprintf("per-message+batch(%d)", ws.batch)
	}
	if ws.transport == "franz-go" {
		m += " on franz-go"
		if ws.static {
			m += " (static members)"
		}
	}
	return m
}

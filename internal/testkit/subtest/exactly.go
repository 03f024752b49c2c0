package subtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// keyedWorkerEnv makes the test binary run a key-ordered worker (keyedRun,
// from JSON in the variable) instead of the tests, until it is killed.
const keyedWorkerEnv = "EXACTLY_SUBTEST_KEYED_WORKER"

// Main is the TestMain of a transport's tests that run the suite's
// exactly-once tests: in the worker process those start, it runs the
// worker on tr instead of the tests.
//
// A suite run on a Variant passes its name to its worker processes in
// VariantEnv: the binary's TestMain gives Main the Transport of that name.
func Main(m *testing.M, tr Transport) {
	if v := os.Getenv(keyedWorkerEnv); v != "" {
		os.Exit(keyedWorkerMain(tr, v))
	}
	os.Exit(m.Run())
}

// keyedRun says where a key-ordered worker reads and writes.
type keyedRun struct {
	Brokers     []string `json:"brokers"`
	Topic       string   `json:"topic"`
	Group       string   `json:"group"`
	DatabaseURL string   `json:"database_url"`
	Schema      string   `json:"schema"`
	// AppName is the worker's Postgres application_name.
	AppName     string `json:"app_name"`
	MaxInFlight int    `json:"max_in_flight"`
}

// keyedCommand is one produced command: the seq-th of its key. A slow one
// takes SlowMs of work; a FailOnce one fails its first run in a process.
type keyedCommand struct {
	Key      string `json:"key"`
	Seq      int    `json:"seq"`
	SlowMs   int    `json:"slow_ms,omitempty"`
	FailOnce bool   `json:"fail_once,omitempty"`
}

type outcomeCounter struct {
	mu sync.Mutex
	n  map[consumer.Outcome]int
}

func (h *outcomeCounter) OnMessage(_ context.Context, ev consumer.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[consumer.Outcome]int{}
	}
	h.n[ev.Outcome]++
}

func (h *outcomeCounter) get(o consumer.Outcome) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[o]
}

// startKeyed runs a Watermill router whose handler, behind the dedupe
// middleware, logs each application of a command in applies (in the
// middleware's transaction) after a few milliseconds of work (more for slow
// commands, which hold the watermark while the window goes on above them).
// running counts handlers at work. It returns a stop function.
func startKeyed(tr Transport, r keyedRun, pool *pgxpool.Pool, hooks consumer.Hooks, running *atomic.Int64, maxRunning *atomic.Int64) (stop func(), err error) {
	store, err := pgstore.New(pool, &pgstore.Config{Schema: r.Schema, RetryBackoff: 5 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "keyed", Hooks: hooks, Logger: Logger()})
	if err != nil {
		return nil, err
	}
	sub, err := tr.NewSubscriber(&kafkapubsub.SubscriberConfig{
		Brokers: r.Brokers, ConsumerGroup: r.Group, MaxInFlight: r.MaxInFlight, KeyOrdered: true,
		NackBackoff: 20 * time.Millisecond, MaxNackBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 20 * time.Second, DrainTimeout: 10 * time.Second,
		Logger: Logger(),
	})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NewSlogLogger(Logger()))
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(mw.Middleware)
	applies := pgx.Identifier{r.Schema, "applies"}.Sanitize()
	var failed sync.Map
	router.AddNoPublisherHandler("keyed", r.Topic, sub, func(msg *message.Message) error {
		_, err := consumer.TxHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			var c keyedCommand
			if err := json.Unmarshal(msg.Payload, &c); err != nil {
				return nil, err
			}
			time.Sleep(time.Duration(5+c.SlowMs) * time.Millisecond) // the handler's work
			if _, done := failed.LoadOrStore(msg.UUID, true); c.FailOnce && !done {
				return nil, errors.New("keyed: first run fails")
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+applies+" (uuid, key, seq, part, off) VALUES ($1, $2, $3, $4, $5)",
				msg.UUID, c.Key, c.Seq, msg.Metadata.Get(kafkapubsub.MetadataPartition), msg.Metadata.Get(kafkapubsub.MetadataOffset))
			return nil, err
		})(msg)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("router: %w", err)
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("router did not start")
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			_ = sub.Close()
		})
	}, nil
}

// keyedWorkerMain is the worker process: it runs until killed.
func keyedWorkerMain(tr Transport, spec string) int {
	var r keyedRun
	if err := json.Unmarshal([]byte(spec), &r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := pgtest.Config(r.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = r.AppName
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var running, maxRunning atomic.Int64
	if _, err := startKeyed(tr, r, pool, nil, &running, &maxRunning); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	select {}
}

// keyedWorld is a topic of keyed commands and a schema that logs their
// applications.
type keyedWorld struct {
	tr         Transport
	run        keyedRun
	db         *pgtest.DB
	partitions int
	n          int
}

func newKeyedWorld(t *testing.T, tr Transport, partitions, n, keys, maxInFlight int) *keyedWorld {
	t.Helper()
	kafkatest.RequireReal(t)
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE "+db.Table("applies")+
		" (id bigserial PRIMARY KEY, uuid text NOT NULL, key text NOT NULL, seq int NOT NULL, part int NOT NULL, off bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	w := &keyedWorld{tr: tr, db: db, partitions: partitions, n: n, run: keyedRun{
		Brokers: brokers, Topic: kafkatest.Topic(t, partitions), Group: kafkatest.Name("g"), Schema: db.Schema, MaxInFlight: maxInFlight,
	}}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		c := keyedCommand{Key: fmt.Sprintf("k%03d", i%keys), Seq: i / keys, FailOnce: i%89 == 5}
		if i%97 == 13 {
			c.SlowMs = 400
		}
		payload, _ := json.Marshal(c)
		msgs[i] = kafka.Message{Key: []byte(c.Key), Value: payload,
			Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(fmt.Sprintf("u-%s-%d", w.run.Topic, i))}}}
	}
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: w.run.Topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchSize: 500}
	defer wr.Close()
	if err := wr.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *keyedWorld) start(t *testing.T, hooks consumer.Hooks, running, maxRunning *atomic.Int64) func() {
	t.Helper()
	stop, err := startKeyed(w.tr, w.run, w.db.Pool, hooks, running, maxRunning)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return stop
}

func (w *keyedWorld) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// assertOncePerKeyOrder checks the rows: every command applied exactly
// once, and each key's commands applied in their order.
func (w *keyedWorld) assertOncePerKeyOrder(t *testing.T) {
	t.Helper()
	applies := w.db.Table("applies")
	if got := w.count(t, "SELECT count(*) FROM "+applies); got != w.n {
		t.Errorf("%d applications, want %d", got, w.n)
	}
	if got := w.count(t, "SELECT count(DISTINCT uuid) FROM "+applies); got != w.n {
		t.Errorf("%d distinct commands applied, want %d", got, w.n)
	}
	if got := w.count(t, "SELECT count(*) FROM (SELECT uuid FROM "+applies+" GROUP BY uuid HAVING count(*) > 1) d"); got != 0 {
		t.Errorf("%d commands applied more than once", got)
	}
	// Each key's applications, in the order they were applied, carry the
	// sequence numbers 0, 1, 2, …
	if got := w.count(t, "SELECT count(*) FROM (SELECT seq, row_number() OVER (PARTITION BY key ORDER BY id) - 1 AS pos FROM "+
		applies+") o WHERE seq <> pos"); got != 0 {
		t.Errorf("%d applications out of their key's order", got)
	}
}

// A second member joins while the first runs 32 keys at a time per
// partition: the partitions move with their windows drained, every command
// is applied once, each key in order.
func KeyOrderedRebalanceExactlyOnce(t *testing.T, tr Transport) {
	t.Parallel()
	w := newKeyedWorld(t, tr, 4, 2000, 200, 32)
	var running, maxRunning atomic.Int64
	hooksA, hooksB := &outcomeCounter{}, &outcomeCounter{}
	w.start(t, hooksA, &running, &maxRunning)
	applies := w.db.Table("applies")
	testenv.WaitFor(t, 2*time.Minute, "the first member to apply 300 commands", func() bool {
		return w.count(t, "SELECT count(*) FROM "+applies) >= 300
	})
	w.start(t, hooksB, &running, &maxRunning)
	WaitCommitted(t, w.run.Group, w.run.Topic, w.partitions, 3*time.Minute)
	w.assertOncePerKeyOrder(t)
	if hooksB.get(consumer.OutcomeApplied)+hooksB.get(consumer.OutcomeDuplicate) == 0 {
		t.Error("the second member handled nothing: no rebalance happened")
	}
	if applied := hooksA.get(consumer.OutcomeApplied) + hooksB.get(consumer.OutcomeApplied); applied != w.n {
		t.Errorf("hooks counted %d applied, want %d", applied, w.n)
	}
	if maxRunning.Load() < 2 {
		t.Errorf("at most %d handlers ran at once: keys did not overlap", maxRunning.Load())
	}
	t.Logf("max handlers at once %d; duplicates A %d B %d", maxRunning.Load(), hooksA.get(consumer.OutcomeDuplicate), hooksB.get(consumer.OutcomeDuplicate))
}

// A worker process with many messages in flight per partition is killed
// with SIGKILL, then another starts: every command is applied once, each key
// in order, and the commands that completed above the committed watermark
// come back as duplicates, all of them.
func KeyOrderedKillExactlyOnce(t *testing.T, tr Transport) {
	t.Parallel()
	w := newKeyedWorld(t, tr, 2, 3000, 300, 64)
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	run := w.run
	run.DatabaseURL, run.AppName = url, kafkatest.Name("keyed-worker")
	spec, _ := json.Marshal(run)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), keyedWorkerEnv+"="+string(spec))
	if v, ok := tr.(Variant); ok {
		cmd.Env = append(cmd.Env, VariantEnv+"="+v.Variant())
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	applies := w.db.Table("applies")
	testenv.WaitFor(t, 2*time.Minute, "the worker to apply 600 commands", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("worker exited: %v (does the test binary's TestMain call subtest.Main?)\n%s", err, stderr.String())
		default:
		}
		return w.count(t, "SELECT count(*) FROM "+applies) >= 600
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	// Postgres rolls back the dead worker's open transactions when it sees
	// its connections close.
	testenv.WaitFor(t, time.Minute, "the worker's sessions to end", func() bool {
		return w.count(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"+run.AppName+"'") == 0
	})
	before := w.count(t, "SELECT count(*) FROM "+applies)
	committed := kafkatest.CommittedOffsets(t, run.Group, run.Topic, w.partitions)
	// Completed above the committed watermark: delivered again, duplicates.
	above := 0
	for p := range w.partitions {
		var n int
		if err := w.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+applies+" WHERE part = $1 AND off >= $2", p, committed[p]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		above += n
	}
	if above == 0 {
		t.Fatalf("nothing completed above the committed offsets %v at the kill (%d applied)", committed, before)
	}
	hooks := &outcomeCounter{}
	var running, maxRunning atomic.Int64
	w.start(t, hooks, &running, &maxRunning)
	WaitCommitted(t, run.Group, run.Topic, w.partitions, 3*time.Minute)
	w.assertOncePerKeyOrder(t)
	if got := hooks.get(consumer.OutcomeDuplicate); got != above {
		t.Errorf("%d duplicates after the restart, want the %d commands completed above the committed offsets", got, above)
	}
	if got := hooks.get(consumer.OutcomeApplied); got != w.n-before {
		t.Errorf("%d applied after the restart, want %d", got, w.n-before)
	}
	t.Logf("killed after %d applied, %d of them above the committed offsets %v; max handlers at once after the restart %d", before, above, committed, maxRunning.Load())
}

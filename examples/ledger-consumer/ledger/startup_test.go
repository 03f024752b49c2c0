package ledger_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kgopubsub"
)

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// proxy forwards connections on addr to target until the test ends or
// the returned stop is called: a dependency that "appears" at addr when
// proxy is called, and goes away on stop.
func proxy(t *testing.T, addr, target string) (stop func()) {
	t.Helper()
	stop, _, _ = gatedProxy(t, addr, target, true)
	return stop
}

// gatedProxy is proxy that, until open is called, closes each connection
// it accepts (a dependency that is not up yet) and counts them.
func gatedProxy(t *testing.T, addr, target string, opened bool) (stop, open func(), refused func() int) {
	t.Helper()
	return gatedProxyOn(t, addr, target, opened, nil)
}

// gatedProxyOnRefuse is a closed gatedProxy that calls onRefuse, with the
// gate's open, after closing each connection it refuses.
func gatedProxyOnRefuse(t *testing.T, addr, target string, onRefuse func(open func())) (stop, open func(), refused func() int) {
	t.Helper()
	return gatedProxyOn(t, addr, target, false, onRefuse)
}

func gatedProxyOn(t *testing.T, addr, target string, opened bool, onRefuse func(open func())) (stop, open func(), refused func() int) {
	t.Helper()
	var gate atomic.Bool
	var refusedN atomic.Int64
	gate.Store(opened)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !gate.Load() {
				refusedN.Add(1)
				c.Close()
				if onRefuse != nil {
					onRefuse(func() { gate.Store(true) })
				}
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return stop, func() { gate.Store(true) }, func() int { return int(refusedN.Load()) }
}

func get(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A worker started before Postgres and Kafka are reachable waits for them:
// it keeps running, /healthz names what is down (and nothing of its
// internals), and it consumes once they appear.
func TestWorkerWaitsForPostgresAndKafka(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	commands := kafkatest.Topic(t, 2)
	wl, err := ledger.Generate(ledger.LoadConfig{Commands: 40, Accounts: 5, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Produce(ctx, brokers, commands, wl.Records); err != nil {
		t.Fatal(err)
	}
	url := pgtest.RequireURL(t)
	pgAddr, kafkaAddr, httpAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pgTarget := net.JoinHostPort(pcfg.ConnConfig.Host, itoa(pcfg.ConnConfig.Port))
	host, port, _ := net.SplitHostPort(pgAddr)
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = host, uint16(atoi(port))
	pcfg.ConnConfig.Fallbacks = nil // "localhost" gives fallbacks that name the real server, past the proxy
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	group := kafkatest.Name("g")
	w, err := ledger.NewWorker(pool, ledger.Config{Schema: db.Schema, Brokers: []string{kafkaAddr}, Commands: commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, MetricsAddr: httpAddr,
		Backoff: 500 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()

	healthz := func(want string) {
		t.Helper()
		var code int
		var body string
		testenv.WaitFor(t, time.Minute, "/healthz to say "+want, func() bool {
			code, body = get(httpAddr, "/healthz")
			return code == http.StatusServiceUnavailable && strings.TrimSpace(body) == want
		})
	}
	healthz("unavailable: database, kafka")
	proxy(t, pgAddr, pgTarget)
	healthz("unavailable: kafka")
	select {
	case err := <-done:
		t.Fatalf("the worker stopped while Kafka was down: %v", err)
	default:
	}
	stopKafka := proxy(t, kafkaAddr, brokers[0])
	end := kafkatest.EndOffsets(t, commands, 2)
	testenv.WaitFor(t, 2*time.Minute, "the worker to consume everything", func() bool {
		got := kafkatest.CommittedOffsets(t, group, commands, 2)
		return got[0] == end[0] && got[1] == end[1]
	})
	testenv.WaitFor(t, time.Minute, "/healthz to answer 200", func() bool { code, _ := get(httpAddr, "/healthz"); return code == 200 })
	bal, err := ledger.Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if len(bal) != 5 {
		t.Fatalf("%d accounts after consuming, want 5", len(bal))
	}
	// The broker goes away (its address no longer answers): /healthz says so.
	stopKafka()
	healthz("unavailable: kafka")
}

func itoa(n uint16) string { return strconv.Itoa(int(n)) }

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// `worker --migrate` whose first connection fails keeps waiting even when
// Postgres answers by the time it checks again: the failure was the
// connection's, not the migration's.
func TestWorkerMigrateRetriesAFailedConnection(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	db := pgtest.NewEmpty(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pgAddr := freeAddr(t)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = pgAddr
	// The gate opens as the first connection is refused: the worker's
	// migration fails on that connection, and Postgres answers from then on.
	gatedProxyOnRefuse(t, pgAddr, net.JoinHostPort(pcfg.ConnConfig.Host, itoa(pcfg.ConnConfig.Port)), func(open func()) { open() })
	commands, group := kafkatest.Topic(t, 1), kafkatest.Name("g")
	if code, out, errs := runCLI(context.Background(), "load", "--brokers", brokers[0], "--commands", commands, "--n", "5", "--accounts", "2"); code != 0 {
		t.Fatalf("load: exit %d\n%s%s", code, out, errs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- ledger.Main(ctx, []string{"worker", "--migrate", "--database-url", u.String(), "--brokers", brokers[0], "--schema", db.Schema,
			"--commands", commands, "--events", kafkatest.Topic(t, 1), "--dead-letter", kafkatest.Topic(t, 1), "--group", group,
			"--metrics-addr", ""}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-done }()
	end := kafkatest.EndOffsets(t, commands, 1)
	testenv.WaitFor(t, 2*time.Minute, "the worker to migrate and consume everything", func() bool {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("the worker exited %d", code)
		default:
		}
		return kafkatest.CommittedOffsets(t, group, commands, 1)[0] == end[0]
	})
}

// `worker --migrate` started before Postgres waits for it, migrates, and
// consumes.
func TestWorkerMigrateWaitsForPostgres(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	db := pgtest.NewEmpty(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pgAddr := freeAddr(t)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = pgAddr
	commands, group := kafkatest.Topic(t, 1), kafkatest.Name("g")
	if code, out, errs := runCLI(context.Background(), "load", "--brokers", brokers[0], "--commands", commands, "--n", "20", "--accounts", "3"); code != 0 {
		t.Fatalf("load: exit %d\n%s%s", code, out, errs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- ledger.Main(ctx, []string{"worker", "--migrate", "--database-url", u.String(), "--brokers", brokers[0], "--schema", db.Schema,
			"--commands", commands, "--events", kafkatest.Topic(t, 1), "--dead-letter", kafkatest.Topic(t, 1), "--group", group,
			"--metrics-addr", ""}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-done }()
	_, open, refused := gatedProxy(t, pgAddr, net.JoinHostPort(pcfg.ConnConfig.Host, itoa(pcfg.ConnConfig.Port)), false)
	testenv.WaitFor(t, time.Minute, "the worker to try Postgres twice", func() bool { return refused() >= 2 })
	open()
	end := kafkatest.EndOffsets(t, commands, 1)
	testenv.WaitFor(t, 2*time.Minute, "the worker to migrate and consume everything", func() bool {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("the worker exited %d", code)
		default:
		}
		return kafkatest.CommittedOffsets(t, group, commands, 1)[0] == end[0]
	})
}

// A share group hands commands out in no order, which the ledger's
// commands cannot take: NewWorker refuses it, saying why.
func TestNewWorkerRefusesAShareGroup(t *testing.T) {
	_, err := ledger.NewWorker(nil, ledger.Config{Brokers: []string{"127.0.0.1:1"},
		Transport: kgopubsub.Transport{GroupProtocol: kgopubsub.ProtocolShare}})
	if err == nil || !strings.Contains(err.Error(), "share group") {
		t.Fatalf("NewWorker on a share group: %v, want a refusal naming the share group", err)
	}
}

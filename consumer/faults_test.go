package consumer_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// A panic after the handler's writes (Recoverer inside the middleware) and a
// handler that outlives middleware.Timeout both roll back; the retries apply
// each message once.
func TestPanicAndTimeoutRollBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	exp, recs := commands(30)
	w.produce(recs...)
	var panicked, timedOut atomic.Int64
	seen := sync.Map{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, handler: w.handler(func(msg *message.Message) error {
		if _, loaded := seen.LoadOrStore(msg.UUID, true); loaded {
			return nil
		}
		switch msg.UUID[len(msg.UUID)-1] % 3 { // a third panic, a third time out
		case 0:
			panicked.Add(1)
			panic("handler bug")
		case 1:
			timedOut.Add(1)
			<-msg.Context().Done()
			return msg.Context().Err()
		}
		return nil
	})})
	w.waitCaughtUp(group, 2*time.Minute)
	w.assertExactlyOnce(exp)
	if panicked.Load() == 0 || timedOut.Load() == 0 {
		t.Fatalf("panics %d, timeouts %d: the test did not exercise both", panicked.Load(), timedOut.Load())
	}
}

// proxy forwards TCP to target and can cut every connection, to simulate a
// database outage.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.setDown(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// A Postgres outage in the middle of the stream: handlers fail, messages are
// nacked and redelivered with back-off; once the database is back every
// message is applied exactly once and none is lost.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 3)
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(px.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil // "localhost" gives fallbacks that name the real server, past the proxy
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w.useStore(pool)
	exp, recs := commands(600)
	group := kafkatest.Name("g")
	slow := func(*message.Message) error { time.Sleep(5 * time.Millisecond); return nil }
	w.startRouter(routerOpts{group: group, handler: w.handler(slow)})
	w.produce(recs...)
	testenv.WaitFor(t, time.Minute, "the first applications", func() bool { return w.applied() >= 30 })
	px.setDown(true)
	time.Sleep(2 * time.Second) // the outage: handlers fail and messages are nacked
	stalled := w.applied()
	px.setDown(false)
	w.waitCaughtUp(group, 3*time.Minute)
	w.assertExactlyOnce(exp)
	if stalled >= len(exp) {
		t.Fatalf("the outage did not interrupt the stream (%d applied before recovery)", stalled)
	}
}

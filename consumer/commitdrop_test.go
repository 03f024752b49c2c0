package consumer_test

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/internal/kafkatest"
	"github.com/exactly-go/exactly/internal/pgtest"
)

// commitQuery is COMMIT as pgx sends it (simple protocol).
var commitQuery = []byte("Q\x00\x00\x00\x0bcommit\x00")

// commitDropper forwards TCP to Postgres; once armed, it lets the next
// COMMIT reach the server and cuts the connection before the answer.
type commitDropper struct {
	ln      net.Listener
	armed   atomic.Bool
	dropped atomic.Int64
}

func newCommitDropper(t *testing.T, target string) *commitDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &commitDropper{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			var sent atomic.Bool
			wg.Add(2)
			go func() {
				defer wg.Done()
				defer up.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if bytes.Contains(buf[:n], commitQuery) && d.armed.CompareAndSwap(true, false) {
							sent.Store(true)
						}
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := up.Read(buf)
					if sent.Load() {
						d.dropped.Add(1)
						up.Close()
						return
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return d
}

// The answer to a message's COMMIT is lost: the store finds the write as
// its own, and the hooks count the message as applied, not as a duplicate.
func TestCommitAnswerLostCountsAsApplied(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	d := newCommitDropper(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(d.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.useStore(pool)
	exp, recs := commands(1)
	w.produce(recs...)
	d.armed.Store(true)
	hooks := &countingHooks{}
	group := kafkatest.Name("g")
	w.startRouter(routerOpts{group: group, hooks: hooks})
	w.waitCaughtUp(group, time.Minute)
	w.assertExactlyOnce(exp)
	if d.dropped.Load() != 1 || hooks.get(consumer.OutcomeApplied) != 1 || hooks.get(consumer.OutcomeDuplicate) != 0 {
		t.Fatalf("answers dropped %d; hooks %v: want 1 applied, no duplicate", d.dropped.Load(), hooks.n)
	}
}

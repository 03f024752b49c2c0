package pgtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// commitQuery is COMMIT as pgx sends it (simple protocol): 'Q', the
// length, the text.
var commitQuery = []byte("Q\x00\x00\x00\x0bcommit\x00")

// CommitDropper forwards TCP to Postgres; once armed, it lets the next
// COMMIT through to the server and cuts the connection before the answer
// comes back, so the client cannot know whether it committed.
type CommitDropper struct {
	ln      net.Listener
	armed   atomic.Bool
	dropped atomic.Int64
}

// Arm makes the proxy drop the answer to the next COMMIT.
func (d *CommitDropper) Arm() { d.armed.Store(true) }

// Dropped counts the COMMIT answers dropped.
func (d *CommitDropper) Dropped() int64 { return d.dropped.Load() }

// NewCommitDropper starts a CommitDropper in front of the test Postgres,
// closed when t ends.
func NewCommitDropper(t testing.TB) *CommitDropper {
	target := pgTarget(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &CommitDropper{ln: ln}
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
			var sent atomic.Bool // this connection sent the armed COMMIT
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
					if sent.Load() { // the server answered the COMMIT: drop it
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
						if !errors.Is(err, io.EOF) {
							return
						}
						return
					}
				}
			}()
		}
	}()
	return d
}

// Pool returns a pool (search_path pinned, as Pool) whose connections go
// through the proxy, closed when t ends.
func (d *CommitDropper) Pool(t testing.TB) *pgxpool.Pool {
	u, _ := URL()
	cfg, err := Config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(d.ln.Addr().(*net.TCPAddr).Port)
	// In clear: the proxy must read the COMMIT it drops the answer to.
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	// Long enough for a SCRAM handshake on a loaded machine.
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func pgTarget(t testing.TB) string {
	u, _ := URL()
	cfg, err := Config(u)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

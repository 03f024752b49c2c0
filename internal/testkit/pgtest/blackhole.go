package pgtest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BlackHole forwards TCP to the test Postgres and can swallow connections:
// a swallowed connection goes silent, every byte dropped in both
// directions and neither side closed, as when the peer is gone without a
// word (a host lost, a firewall that drops a flow). A client call on it
// blocks until its own context ends; the server's session stays until
// Postgres ends it.
type BlackHole struct {
	ln        net.Listener
	target    string
	mu        sync.Mutex
	on        bool
	links     []*holeLink
	swallowed atomic.Int64
	delay     atomic.Int64 // nanoseconds each chunk waits before it is forwarded
}

type holeLink struct {
	c, up net.Conn // up is nil for a connection accepted while swallowing
	dead  atomic.Bool
	delay *atomic.Int64
}

// NewBlackHole starts a BlackHole in front of the test Postgres, closed
// (with every connection it holds) when t ends.
func NewBlackHole(t testing.TB) *BlackHole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &BlackHole{ln: ln, target: pgTarget(t)}
	t.Cleanup(b.close)
	go b.accept()
	return b
}

// Swallow makes every connection open now dead for good, and holds the
// connections accepted from now on silent too, until Release.
func (b *BlackHole) Swallow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = true
	for _, l := range b.links {
		if !l.dead.Swap(true) {
			b.swallowed.Add(1)
		}
	}
}

// Release lets new connections through again; those swallowed stay dead.
func (b *BlackHole) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
}

// Delay makes every chunk of bytes wait d before it is forwarded, either
// way: a server d away (a round trip of 2d), from now on.
func (b *BlackHole) Delay(d time.Duration) { b.delay.Store(int64(d)) }

// Swallowed counts the connections swallowed so far.
func (b *BlackHole) Swallowed() int64 { return b.swallowed.Load() }

// Pool returns a pool (search_path pinned, as Pool) whose connections go
// through the black hole, closed when t ends. edit, when not nil, adjusts
// its configuration first.
func (b *BlackHole) Pool(t testing.TB, edit func(*pgxpool.Config)) *pgxpool.Pool {
	u, _ := URL()
	cfg, err := Config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(b.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil // "localhost" gives fallbacks that name the real server, past the proxy
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if edit != nil {
		edit(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (b *BlackHole) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		l := &holeLink{c: c, delay: &b.delay}
		b.mu.Lock()
		on := b.on
		b.mu.Unlock()
		if !on {
			if l.up, err = net.Dial("tcp", b.target); err != nil {
				c.Close()
				continue
			}
		}
		b.mu.Lock()
		if on || b.on {
			if !l.dead.Swap(true) {
				b.swallowed.Add(1)
			}
		}
		b.links = append(b.links, l)
		b.mu.Unlock()
		go l.pump(c, l.up)
		if l.up != nil {
			go l.pump(l.up, c)
		}
	}
}

// pump copies from src to dst (nil: nowhere) while the link is alive, and
// drops what it reads once it is dead. A side that closes closes the other
// while the link is alive; a dead link closes nothing.
func (l *holeLink) pump(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if d := time.Duration(l.delay.Load()); n > 0 && d > 0 {
			time.Sleep(d)
		}
		if n > 0 && dst != nil && !l.dead.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil && !l.dead.Load() {
				src.Close()
				return
			}
		}
		if err != nil {
			if !l.dead.Load() && dst != nil {
				dst.Close()
			}
			return
		}
	}
}

func (b *BlackHole) close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.links {
		l.dead.Store(true)
		l.c.Close()
		if l.up != nil {
			l.up.Close()
		}
	}
	b.links = nil
}

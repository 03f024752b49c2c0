package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// commitQuery is COMMIT as pgx sends it (simple protocol): 'Q', the
// length, the text.
var commitQuery = []byte("Q\x00\x00\x00\x0bcommit\x00")

// commitDropper forwards TCP to Postgres; once armed, it lets the next
// COMMIT through to the server and cuts the connection before the answer
// comes back, so the client cannot know whether it committed.
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

// poolVia returns a pool whose connections go through addr.
func poolVia(t *testing.T, addr net.Addr) *pgxpool.Pool {
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(addr.(*net.TCPAddr).Port)
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func pgTarget(t *testing.T) string {
	u, _ := pgtest.URL()
	cfg, err := pgtest.Config(u)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// The connection drops after the server received COMMIT and before its
// answer: Do runs the transaction again, finds the key it wrote itself and
// reports the message as applied (OutcomeNew), not as a duplicate; fn ran
// once and its write is there once.
func TestDoCommitAnswerLost(t *testing.T) {
	t.Parallel()
	_, db := newStore(t, nil)
	d := newCommitDropper(t, pgTarget(t))
	s, err := pgstore.New(poolVia(t, d.ln.Addr()), &pgstore.Config{Schema: db.Schema, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var calls atomic.Int64
	d.armed.Store(true)
	c, err := s.Do(ctx, dedupetest.Req("s", "k", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		calls.Add(1)
		return []byte("r"), apply(ctx, db, tx, "k")
	})
	if d.dropped.Load() != 1 {
		t.Fatalf("the COMMIT's answer was dropped %d times, want 1", d.dropped.Load())
	}
	if err != nil || c.Outcome != dedupe.OutcomeNew || string(c.Record.Result) != "r" {
		t.Fatalf("Do = %v %q %v, want OutcomeNew with the result", c.Outcome, c.Record.Result, err)
	}
	if n, _ := applied(ctx, db, "k"); n != 1 || calls.Load() != 1 {
		t.Fatalf("applied %d times, fn ran %d times; want 1 and 1", n, calls.Load())
	}
	// A later call is a duplicate.
	c, err = s.Do(ctx, dedupetest.Req("s", "k", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if err != nil || c.Outcome != dedupe.OutcomeDuplicate {
		t.Fatalf("second Do = %v %v, want a duplicate", c.Outcome, err)
	}
}

// The caller's context is cancelled (a middleware.Timeout firing) after fn's
// external effect succeeded: DoLease still completes the key, so the next
// delivery is a duplicate and the effect is not repeated.
func TestDoLeaseCompletesAfterCallerCancelled(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, nil)
	var effects atomic.Int64
	req := dedupetest.Req("payments", "p-1", "p")
	ctx, cancel := context.WithCancel(context.Background())
	_, err := s.DoLease(ctx, req, time.Second, func(context.Context) ([]byte, error) {
		effects.Add(1) // the payment went through
		cancel()       // then the caller's timeout fires
		return []byte("paid"), nil
	})
	if err != nil {
		t.Fatalf("DoLease after the effect: %v", err)
	}
	for i := 0; i < 3; i++ {
		c, err := s.DoLease(context.Background(), req, time.Second, func(context.Context) ([]byte, error) {
			effects.Add(1)
			return nil, nil
		})
		if err != nil || c.Outcome != dedupe.OutcomeDuplicate || string(c.Record.Result) != "paid" {
			t.Fatalf("delivery %d: %v %q %v, want the duplicate", i+2, c.Outcome, c.Record.Result, err)
		}
	}
	if effects.Load() != 1 {
		t.Fatalf("the external effect ran %d times, want 1", effects.Load())
	}
	// A failure with a cancelled context releases the key all the same.
	fail := dedupetest.Req("payments", "p-2", "p")
	ctx, cancel = context.WithCancel(context.Background())
	_, err = s.DoLease(ctx, fail, time.Hour, func(context.Context) ([]byte, error) {
		cancel()
		return nil, errors.New("payment API down")
	})
	if err == nil || strings.Contains(err.Error(), "release") {
		t.Fatalf("err = %v, want the failure alone (released)", err)
	}
	c, err := s.DoLease(context.Background(), fail, time.Hour, func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || c.Outcome != dedupe.OutcomeTakeover {
		t.Fatalf("after a released failure: %v %v, want a takeover at once", c.Outcome, err)
	}
}

// A table that is not where the store looks is a configuration error that
// names the fix, at start-up (Check) and on every call: never retryable,
// never permanent.
func TestMissingTableIsAConfigurationError(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	s, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, err := range map[string]error{
		"Check": s.Check(ctx),
		"Do": func() error {
			_, err := s.Do(ctx, dedupetest.Req("s", "k", "p"), func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
			return err
		}(),
		"Acquire": func() error { _, err := s.Acquire(ctx, dedupetest.Req("s", "k", "p"), time.Minute); return err }(),
	} {
		if !errors.Is(err, dedupe.ErrMisconfigured) || dedupe.IsRetryable(err) || dedupe.IsPermanent(err) ||
			!strings.Contains(err.Error(), "42P01") || !strings.Contains(err.Error(), "migrations.Migrate") {
			t.Errorf("%s: err = %v, want a configuration error naming migrations.Migrate", name, err)
		}
	}
	good, _ := newStore(t, nil)
	if err := good.Check(ctx); err != nil {
		t.Fatalf("Check on a migrated schema: %v", err)
	}
}

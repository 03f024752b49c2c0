package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// copiesPublisher counts the copies of each message it is given.
type copiesPublisher struct {
	mu    sync.Mutex
	count map[string]int
}

func (c *copiesPublisher) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.count[m.UUID]++
	}
	return nil
}

func (*copiesPublisher) Close() error { return nil }

// poolerMode is the exec mode the pooler tests run with: the URL's, or
// exec when it names none that works behind PgBouncer 1.18 in transaction
// mode (its server-side statements outlive the client's transaction).
func poolerMode(cfg *pgxpool.Config) {
	if cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
}

// Behind a transaction pooler, one relay and then two publish every output
// exactly once, and no lane lock stays held once they are done: a session
// advisory lock taken and released in separate statements ran on two
// server connections there, its release failed and the lane stayed held.
func TestRelaysBehindTransactionPooler(t *testing.T) {
	for _, relays := range []int{1, 2} {
		t.Run(fmt.Sprint(relays, " relays"), func(t *testing.T) {
			f := &fixture{db: pgtest.New(t)}
			var err error
			if f.w, err = outbox.NewWriter(&outbox.Config{Schema: f.db.Schema}); err != nil {
				t.Fatal(err)
			}
			pooled := pgtest.PoolerPool(t, poolerMode)
			n := 40 * relays * relays
			var uuids []string
			for i := 0; i < n; i += 10 {
				var msgs []*message.Message
				for j := i; j < i+10; j++ {
					m := keyed(fmt.Sprint("k", j%23), fmt.Sprint(j))
					msgs = append(msgs, m)
					uuids = append(uuids, m.UUID)
				}
				f.commitOne(t, "pooled", msgs...)
			}
			pub := &copiesPublisher{count: map[string]int{}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			for range relays {
				r, err := outbox.NewRelay(pooled, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema},
					PollInterval: 50 * time.Millisecond, BatchSize: 7, Logger: quiet()})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil && f.pending(t) > 0 {
						if _, err := r.RunOnce(ctx); err != nil {
							t.Logf("RunOnce: %v", err)
						}
					}
				}()
			}
			wg.Wait()
			if p := f.pending(t); p != 0 {
				t.Errorf("%d of %d outputs stay PENDING", p, n)
			}
			pub.mu.Lock()
			for _, u := range uuids {
				if c := pub.count[u]; c != 1 {
					t.Errorf("output %s was published %d times, want once", u, c)
				}
			}
			pub.mu.Unlock()
			var held int
			id := lockID(f.db.Schema)
			if err := f.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND (classid::bigint << 32) | objid::bigint BETWEEN $1 AND $1 + $2 - 1`, id, outbox.Lanes).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Errorf("%d lane lock(s) stay held after the relays are done: no relay works those lanes", held)
			}
		})
	}
}

// Behind a transaction pooler LISTEN cannot work (the registration stays on
// a server session the relay no longer holds): the relay polls only, and
// never registers as a waiter, so producers do not pay for a NOTIFY that
// no relay hears. Messages are published by the poll.
func TestRelayPollsOnlyBehindTransactionPooler(t *testing.T) {
	if pgtest.PoolerURL(t) != "" && pgtest.PoolerMode() != "transaction" {
		t.Skipf("the pooler runs in %s mode", pgtest.PoolerMode())
	}
	f := &fixture{db: pgtest.New(t)}
	var err error
	if f.w, err = outbox.NewWriter(&outbox.Config{Schema: f.db.Schema}); err != nil {
		t.Fatal(err)
	}
	first := keyed("k", "1")
	f.commitOne(t, "polled", first)
	pub := &copiesPublisher{count: map[string]int{}}
	r, err := outbox.NewRelay(pgtest.PoolerPool(t, poolerMode), pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema},
		PollInterval: 500 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	published := func(u string) {
		t.Helper()
		testenv.WaitFor(t, 20*time.Second, "message "+u+" published", func() bool { return f.status(t, u) == "PUBLISHED" })
	}
	published(first.UUID)
	// Idle now: a relay that listened would register within milliseconds.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) { // observe a second
		var n int
		if err := f.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.db.Table("exactly_outbox_waiters")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("the relay behind a transaction pooler registered as a waiter: producers notify, and it never hears them")
		}
	}
	second := keyed("k", "2")
	f.commitOne(t, "polled", second)
	published(second.UUID)
}

// BenchmarkRelayLatency measures the time from a producer's commit to its
// message marked PUBLISHED with LISTEN/NOTIFY and with PollOnly (the
// default PollInterval, 1s), on a direct connection:
//
//	go test -run '^$' -bench RelayLatency -benchtime 20x ./outbox/
func BenchmarkRelayLatency(b *testing.B) {
	for _, pollOnly := range []bool{false, true} {
		name := "listen"
		if pollOnly {
			name = "poll-only"
		}
		b.Run(name, func(b *testing.B) {
			f := &fixture{db: pgtest.New(b)}
			var err error
			if f.w, err = outbox.NewWriter(&outbox.Config{Schema: f.db.Schema}); err != nil {
				b.Fatal(err)
			}
			r, err := outbox.NewRelay(f.db.Pool, &copiesPublisher{count: map[string]int{}}, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema},
				PollOnly: pollOnly, Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			defer func() { cancel(); <-done }()
			warm := keyed("k", "warm")
			f.commitOne(b, "latency", warm)
			testenv.WaitFor(b, 10*time.Second, "warm-up", func() bool { return f.status(b, warm.UUID) == "PUBLISHED" })
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				// Let the relay go idle at a random point of its poll.
				time.Sleep(time.Duration(i%10) * 97 * time.Millisecond) // spread the commits over the poll interval
				m := keyed("k", fmt.Sprint(i))
				start := time.Now()
				f.commitOne(b, "latency", m)
				testenv.WaitFor(b, 10*time.Second, "published", func() bool { return f.status(b, m.UUID) == "PUBLISHED" })
				total += time.Since(start)
			}
			b.StopTimer()
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/publish")
		})
	}
}

// The writer and the relay work in every pgx QueryExecMode (with exec and
// simple_protocol pgx takes a parameter's type from its Go type: the
// metadata went as bytea, which is not JSON).
func TestEveryExecMode(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			cfg, err := pgtest.Config(pgtest.RequireURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 4
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			w, err := outbox.NewWriter(&outbox.Config{Schema: db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			m := keyed("k", "1")
			m.Metadata.Set("trace", `"quoted" \ value`)
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, "modes", m) }); err != nil {
				t.Fatalf("WriteTx: %v", err)
			}
			pub := &copiesPublisher{count: map[string]int{}}
			r, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: db.Schema}, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := r.RunOnce(ctx); err != nil || n != 1 {
				t.Fatalf("RunOnce = %d, %v; want 1 published", n, err)
			}
			if pub.count[m.UUID] != 1 {
				t.Fatalf("message published %d times", pub.count[m.UUID])
			}
		})
	}
}

package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// A cut is judged from the session's state, read on a connection of the
// watch's own that is opened a while before the reads start, so that
// opening it (a remote server: several round trips, more with TLS) does not
// leave no read done by the deadline. With the server 30ms away (a round
// trip of 60ms, about 300ms to open a connection) and a 5s deadline, an
// attempt whose handler ran its own code until the deadline is the
// message's, and one that waited for a lock held elsewhere is the
// database's.
func TestCutJudgedOverASlowConnection(t *testing.T) {
	t.Parallel()
	hole := pgtest.NewBlackHole(t)
	pool := hole.Pool(t, nil)
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	hole.Delay(30 * time.Millisecond)
	lock := holdLock(t)
	for name, want := range map[string]wait{"ran its own code": waitMessage, "waited for a lock": waitDatabase} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		w := watchCut(actx, pool, tx.Conn())
		if want == waitDatabase {
			_, _ = tx.Exec(actx, "SELECT pg_advisory_xact_lock($1)", lock)
			if actx.Err() == nil {
				cancel()
				_ = tx.Rollback(ctx)
				t.Fatal("the lock held elsewhere was granted before the deadline")
			}
		} else {
			<-actx.Done()
		}
		got, what := w.result()
		cancel()
		_ = tx.Rollback(ctx)
		if got != want {
			t.Errorf("a handler that %s until its deadline: judged %d (%q), want %d", name, got, what, want)
		}
	}
}

// holdLock takes a session advisory lock until t ends, and returns it. It
// is held on a connection of its own, straight to the server: a connection
// of the shared pool goes back to other tests, which may close it (a
// cancelled query), and one through a transaction pooler (make
// test-pooler) leaves the lock on a server connection that the pooler
// hands to other clients and closes when one of them goes away mid-
// transaction; either way the lock would be released before the deadline.
func holdLock(t *testing.T) int64 {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgtest.RequireURL(t))
	if err != nil {
		t.Fatal(err)
	}
	holder, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	lock := time.Now().UnixNano()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		t.Fatal(err)
	}
	return lock
}

// judge runs watchCut on a transaction of pool bounded by a deadline d
// away, the handler running its own code (want waitMessage) or waiting for
// a lock held elsewhere (want waitDatabase) until the deadline, and
// returns the verdicts.
func judge(t *testing.T, pool *pgxpool.Pool, d time.Duration) map[wait]wait {
	t.Helper()
	ctx := context.Background()
	lock := holdLock(t)
	out := map[wait]wait{}
	for _, want := range []wait{waitMessage, waitDatabase} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, d)
		w := watchCut(actx, pool, tx.Conn())
		if want == waitDatabase {
			_, _ = tx.Exec(actx, "SELECT pg_advisory_xact_lock($1)", lock)
		} else {
			_, _ = tx.Exec(actx, "SELECT 1") // then its own code
			<-actx.Done()
		}
		out[want], _ = w.result()
		cancel()
		_ = tx.Rollback(ctx)
	}
	return out
}

// Behind a transaction pooler the verdict names the attempt's server
// session by the process ID read in its transaction: the ID the connection
// was given at start-up is the pooler's, which pg_stat_activity does not
// know, and every verdict was unknown (a command whose own work outlasted
// its deadline was never dead-lettered, and held its partition).
func TestCutJudgedBehindTransactionPooler(t *testing.T) {
	pool := pgtest.PoolerPool(t, func(c *pgxpool.Config) {
		if c.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
			c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
	})
	for want, got := range judge(t, pool, 5*time.Second) {
		if got != want {
			t.Errorf("behind the pooler, an attempt that should be judged %d was judged %d", want, got)
		}
	}
}

// A pool of one connection whose password comes from its BeforeConnect
// (an IAM token, a rotated password): the verdict's connection is opened
// through the pool's connect path, since the pool has none to spare (it
// was opened from the pool's config, without the password, and every
// verdict was unknown).
func TestCutJudgedOnAPoolOfOneWithBeforeConnect(t *testing.T) {
	cfg, err := pgtest.Config(pgtest.RequireURL(t))
	if err != nil {
		t.Fatal(err)
	}
	password := cfg.ConnConfig.Password
	cfg.ConnConfig.Password = "wrong"
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		c.Password = password
		return nil
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for want, got := range judge(t, pool, 5*time.Second) {
		if got != want {
			t.Errorf("on a pool of 1 with BeforeConnect, an attempt that should be judged %d was judged %d", want, got)
		}
	}
}

// An attempt cut with an unknown verdict (the session could not be read)
// counts against its message while the database answers, so that after
// MaxAttempts it is poison and leaves its partition (it was the database's
// fault for ever, and the partition stopped for good).
func TestUnknownVerdictCannotHoldAPartition(t *testing.T) {
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMiddleware(store, &Config{Scope: "unknown-verdict", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
	ev := &Event{Key: msg.UUID, Scope: "unknown-verdict", Topic: "t"}
	var last error
	for i := 0; i < 3; i++ {
		last = m.failed(msg, ev, &cutError{wait: waitUnknown, err: context.DeadlineExceeded}, true)
		if ev.Outcome == OutcomeUnavailable {
			t.Fatalf("attempt %d: an unknown verdict with the database answering was taken as an outage", i+1)
		}
	}
	if !dedupe.IsPermanent(last) || !errors.Is(last, dedupe.ErrPoisonMessage) {
		t.Fatalf("after 3 unknown verdicts: %v, want the message poison", last)
	}
}

// In batch mode too: an attempt cut with an unknown verdict while the
// database answers is split down to its messages (which the per-message
// path counts), not taken as an outage that nacks the batch whole for
// ever.
func TestBatchUnknownVerdictCannotHoldAPartition(t *testing.T) {
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewBatchConsumer(store, func(context.Context, pgx.Tx, []*message.Message) ([][]*message.Message, error) { return nil, nil },
		&BatchConfig{Config: Config{Scope: "unknown-verdict", MaxAttempts: 3}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = c.judge(ctx, context.DeadlineExceeded, &cutError{wait: waitUnknown, err: context.DeadlineExceeded})
	if outcome, ok := c.notTheirs(ctx, err); ok {
		t.Fatalf("an unknown verdict with the database answering: %v, outcome %s, want it split to the messages", err, outcome)
	}
	// A cut while waiting for the database stays an outage.
	err = c.judge(ctx, context.DeadlineExceeded, &cutError{wait: waitDatabase, err: context.DeadlineExceeded})
	if outcome, ok := c.notTheirs(ctx, err); !ok || outcome != OutcomeUnavailable {
		t.Fatalf("a cut waiting for the database: %v, outcome %s, want unavailable", err, outcome)
	}
}

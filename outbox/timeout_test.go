package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/outbox"
)

// A relay whose connections all go silent at once (the peer gone without a
// word: every byte dropped, nothing closed; new connections held silent for
// a while, then fine) goes on once new connections work: every committed
// row reaches Kafka exactly once, in key order, and is marked. Without
// StatementTimeout its next call on a dead connection never returns.
func TestRelayStatementTimeoutOnHalfOpenConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	hole := pgtest.NewBlackHole(t)
	app := "relay-" + f.db.Schema
	pool := hole.Pool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 6
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	})
	r, err := outbox.NewRelay(pool, f.pub, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema},
		PollInterval: 200 * time.Millisecond, StatementTimeout: 2 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)

	f.write(t, 5, 20, 10)
	testenv.WaitFor(t, time.Minute, "the rows written before the black hole to be published", func() bool { return f.pending(t) == 0 })
	hole.Swallow()
	f.write(t, 10, 20, 10) // on a pool of its own, past the black hole
	time.Sleep(3 * time.Second)
	hole.Release()
	// The server ends the sessions whose peer is gone, as its TCP
	// keepalives would (after hours by default): a session swallowed while
	// its relay held lanes would otherwise hold them for the rest of the
	// test. That releases nothing on the relay's side: a call on a
	// swallowed connection still waits until its own deadline.
	if _, err := f.db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app); err != nil {
		t.Fatal(err)
	}

	testenv.WaitFor(t, time.Minute, "the rows written during the black hole to be published", func() bool { return f.pending(t) == 0 })
	f.check(t, false)
	var published, other int
	if err := f.db.Pool.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE status = 'PUBLISHED'), count(*) FILTER (WHERE status <> 'PUBLISHED') FROM "+
		f.db.Table("exactly_outbox")).Scan(&published, &other); err != nil {
		t.Fatal(err)
	}
	if published != len(f.wanted) || other != 0 {
		t.Fatalf("%d rows PUBLISHED and %d otherwise, want %d and 0", published, other, len(f.wanted))
	}
	if hole.Swallowed() == 0 {
		t.Fatal("no connection was swallowed: the test did not exercise a dead connection")
	}
}

// NewRelay refuses negative sizes and durations.
func TestNewRelayRefusesNegatives(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for field, cfg := range map[string]outbox.RelayConfig{
		"BatchSize":          {BatchSize: -1},
		"MaxAttempts":        {MaxAttempts: -1},
		"PollInterval":       {PollInterval: -time.Second},
		"RetryBackoff":       {RetryBackoff: -time.Second},
		"MaxRetryBackoff":    {MaxRetryBackoff: -time.Second},
		"PublishedRetention": {PublishedRetention: -time.Second},
		"StatementTimeout":   {StatementTimeout: -time.Second},
	} {
		if _, err := outbox.NewRelay(pool, &nopPublisher{}, &cfg); err == nil || !strings.Contains(err.Error(), "RelayConfig."+field+" is -") {
			t.Errorf("%s negative: err %v, want a refusal naming RelayConfig.%s", field, err, field)
		}
	}
	if _, err := outbox.NewRelay(pool, &nopPublisher{}, &outbox.RelayConfig{StatementTimeout: time.Second}); err != nil {
		t.Errorf("a positive StatementTimeout: %v", err)
	}
}

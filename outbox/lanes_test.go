package outbox_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/outbox"
)

// lockID is the advisory lock key of lane 0 of the default table in schema
// (the relay's: a hash of its name with the low byte cleared).
func lockID(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("exactly/outbox/" + schema + ".exactly_outbox"))
	return int64(h.Sum64() &^ 0xff)
}

// Postgres may grant a lane's lock to a relay that waits for it just as the
// wait's lock_timeout fires, and still fail the statement with the timeout.
// The relay must not hand that connection back to the pool holding the
// lane, where no relay works it until the connection closes (a session
// lock outlived the aborted transaction; the relay's transaction-scoped
// locks end with it). The race is made certain by freezing the
// waiting backend while the lane is handed over and the timeout passes.
func TestLaneGrantedAsTheWaitTimesOut(t *testing.T) {
	t.Parallel()
	// The relay needs no broker here: what it publishes is not looked at.
	f := &fixture{db: pgtest.New(t)}
	var err error
	if f.w, err = outbox.NewWriter(&outbox.Config{Schema: f.db.Schema}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A message in every lane.
	byLane := map[int]string{}
	for i := 0; len(byLane) < outbox.Lanes; i++ {
		k := fmt.Sprint("k", i)
		if _, ok := byLane[laneOf(k)]; !ok {
			m := keyed(k, "1")
			f.commitOne(t, "lanes", m)
			byLane[laneOf(k)] = m.UUID
		}
	}
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgtest.Config(url)
	if err != nil {
		t.Fatal(err)
	}
	app := "relay-wait-" + f.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// Another relay's session holds every lane: RunOnce waits for one.
	holder, err := f.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	id := lockID(f.db.Schema)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1::bigint + l) FROM generate_series(0, $2::int - 1) l`, id, outbox.Lanes); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`) //nolint:errcheck

	poll := time.Second
	r, err := outbox.NewRelay(pool, &nopPublisher{}, &outbox.RelayConfig{Config: outbox.Config{Schema: f.db.Schema}, PollInterval: poll, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.RunOnce(ctx); done <- err }()

	// The relay's backend, waiting for its lane.
	var pid int
	var key int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := f.db.Pool.QueryRow(ctx, `SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`, app).Scan(&pid, &key)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay never waited for a lane: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // poll
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		<-done
		t.Skipf("cannot stop the relay's Postgres backend %d (the server is not local, or another user's): %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	// The lane is handed over while the backend is frozen...
	var ok bool
	if err := holder.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&ok); err != nil || !ok {
		t.Fatalf("unlock of the awaited lane: %v %v", ok, err)
	}
	// ...and its lock_timeout passes before it runs again.
	time.Sleep(poll + poll/2) // the fault: the backend stays frozen past its timeout
	resume()
	if err := <-done; err != nil {
		t.Logf("RunOnce: %v", err)
	}

	// The relay let go of the lane with its transaction (or found it held
	// it after all, and worked it): the next pass works it.
	if _, err := r.RunOnce(ctx); err != nil {
		t.Fatalf("RunOnce after the wait: %v", err)
	}
	if got := f.status(t, byLane[int(key-id)]); got != "PUBLISHED" {
		t.Errorf("the message in the lane granted as the wait timed out is %s, want PUBLISHED", got)
	}
	// The relay is done: none of its sessions may hold a lane.
	var n int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("after RunOnce returned, %d lane lock(s) stay held by its pool's connections: no relay works those lanes", n)
	}
}

// nopPublisher accepts every message and keeps none.
type nopPublisher struct{}

func (*nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (*nopPublisher) Close() error                              { return nil }

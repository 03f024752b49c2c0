package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// TestCleanupOneRunnerAtATime: while another session holds the table's
// cleanup lock, Cleanup deletes nothing and says so.
func TestCleanupOneRunnerAtATime(t *testing.T) {
	db := pgtest.New(t)
	s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("exactly_keys")+
		" (scope, key, fingerprint, status, expires_at) VALUES ('s', 'k', repeat('a', 64), 'COMPLETED', now() - interval '1 day')"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", s.lockID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Cleanup(ctx, nil); !errors.Is(err, dedupe.ErrCleanupBusy) || n != 0 {
		t.Fatalf("Cleanup = %d, %v; want ErrCleanupBusy", n, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", s.lockID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Cleanup(ctx, nil); err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want 1", n, err)
	}
}

func TestRunCleanup(t *testing.T) {
	db := pgtest.New(t)
	s, err := New(db.Pool, &Config{Schema: db.Schema, Layout: LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.RunCleanup(ctx, 0, nil); err == nil {
		t.Fatal("a zero interval was accepted")
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table("exactly_keys")+
		" (scope, key, fingerprint, status, expires_at) SELECT 's', 'k' || g, repeat('a', 64), 'COMPLETED', now() - interval '1 day' FROM generate_series(1, 50) g"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.RunCleanup(ctx, 10*time.Millisecond, nil) }()
	testenv.WaitFor(t, 10*time.Second, "the expired keys to go", func() bool {
		st, err := s.Stats(ctx)
		return err == nil && st.Completed == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// part is the store's partitioned layout; nil on the single table.
func (s *Store) part() *partitioned {
	p, _ := s.l.(*partitioned)
	return p
}

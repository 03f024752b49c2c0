package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/pgtest"
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
	db := pgtest.New(t)
	hole := pgtest.NewBlackHole(t)
	pool := hole.Pool(t, nil)
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	hole.Delay(30 * time.Millisecond)
	// The lock is held on a connection of the test's own: one of the shared
	// pool's goes back to other tests, which may close it (a cancelled
	// query) and so release the lock.
	holder, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	lock := time.Now().UnixNano()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		t.Fatal(err)
	}
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

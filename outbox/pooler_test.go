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

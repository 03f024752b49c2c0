package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

type recordingPublisher struct {
	mu   sync.Mutex
	sent []string
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.sent = append(p.sent, m.UUID)
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

// TestSchemaFromSearchPath: with the schema named once, in the pool's
// search_path, and no Schema in any Config, the migrations, the key store,
// the outbox Writer and the Relay all use it.
func TestSchemaFromSearchPath(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	url, err := pgtest.URL()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	if err := migrations.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Check(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(ctx, dedupetest.Req("s", "k", "p"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, w.WriteTx(ctx, tx, "events", message.NewMessage("out-1", []byte("{}")))
	}); err != nil {
		t.Fatal(err)
	}
	var keys, rows int
	if err := db.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+db.Keys()+"), (SELECT count(*) FROM "+
		db.Table("exactly_outbox")+")").Scan(&keys, &rows); err != nil || keys != 1 || rows != 1 {
		t.Fatalf("in schema %s: %d keys, %d outbox rows, %v; want 1 and 1", db.Schema, keys, rows, err)
	}
	pub := &recordingPublisher{}
	relay, err := outbox.NewRelay(pool, pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RunOnce(ctx); err != nil || n != 1 || len(pub.sent) != 1 || pub.sent[0] != "out-1" {
		t.Fatalf("relay: %d, %v, sent %v", n, err, pub.sent)
	}
}

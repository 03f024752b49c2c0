package pgstore_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// records is a log handler that keeps the records at INFO and above.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) about(s string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

// A fresh schema's store retires and drops the empty single key table
// without a word at INFO (a new user read "the single key table has no
// live key left" as something of theirs being dropped); an upgraded one,
// whose single table held keys, says at INFO that they all expired.
func TestSingleTableRetireLogsOnlyWhatIsTrue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newStore := func(t *testing.T, db *pgtest.DB) (*pgstore.Store, *records) {
		logs := &records{}
		s, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutPartitioned, Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		pgstore.SetDropAfter(s, 0)
		return s, logs
	}
	gone := func(t *testing.T, db *pgtest.DB) {
		t.Helper()
		var there bool
		if err := db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", db.Table("exactly_keys")).Scan(&there); err != nil || there {
			t.Fatalf("the single key table is still there (%v)", err)
		}
	}
	t.Run("fresh", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		s, logs := newStore(t, db)
		if err := s.Check(ctx); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := s.Cleanup(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		gone(t, db)
		if got := logs.about("single key table"); len(got) > 0 {
			t.Errorf("a fresh schema logged at INFO: %q", got)
		}
	})
	t.Run("upgraded", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		s, logs := newStore(t, db)
		single, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := single.Do(ctx, dedupetest.Req("s", uuid.NewString(), "p"), noop); err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("single-table claim: %v %v", c.Decision, err)
		}
		if _, err := db.Pool.Exec(ctx, "UPDATE "+db.Table("exactly_keys")+" SET expires_at = now() - interval '1 day'"); err != nil {
			t.Fatal(err)
		}
		startKeepingSingleTable(t, s, db)
		for range 2 {
			if _, err := s.Cleanup(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
		gone(t, db)
		if got := logs.about("single key table"); len(got) != 2 || !strings.Contains(got[0], "has expired") {
			t.Errorf("an upgraded schema logged %q; want the expiry of its keys and the drop, at INFO", got)
		}
	})
}

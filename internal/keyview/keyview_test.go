package keyview_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/dedupe/dedupetest"
	"github.com/exactly-go/exactly/internal/keyview"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// ulidAt returns a ULID minted at t, as its canonical text.
func ulidAt(t time.Time) string {
	var id dedupe.TimeID
	rand.Read(id.Bytes[6:])
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(id.Bytes[:6], ms[2:])
	id.Kind = dedupe.ULID
	return id.String()
}

func v7At(t time.Time) string {
	u := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	return u.String()
}

// Every kind of ID the partitioned layout stores in compact form comes
// back as the ID that was claimed, with its fingerprint and source, beside
// the single table's keys as they are.
func TestKeysOfBothLayouts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	single, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Layout: pgstore.LayoutSingleTable})
	if err != nil {
		t.Fatal(err)
	}
	type claimed struct{ scope, id, fp string }
	var want []claimed
	claim := func(s *pgstore.Store, scope, id string) {
		t.Helper()
		req := dedupetest.Req(scope, id, "payload of "+id)
		req.Source = dedupe.Source{Topic: "topic-" + scope, Partition: 3, Offset: int64(len(want))}
		if c, err := s.Do(ctx, req, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil || c.Decision != dedupe.DecisionNew {
			t.Fatalf("claim %s/%s: %v %v", scope, id, c.Decision, err)
		}
		want = append(want, claimed{scope, id, string(req.Fingerprint)})
	}
	claim(single, "old", uuid.NewString())
	claim(single, "old", "ORDER-1")

	part, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := part.Check(ctx); err != nil {
		t.Fatal(err)
	}
	now, long := time.Now(), time.Now().Add(-400*24*time.Hour)
	for _, id := range []string{
		uuid.NewString(),                       // 'u'
		v7At(now),                              // '7'
		v7At(long),                             // 'o': minted before the partitions
		ulidAt(now),                            // 'l'
		ulidAt(long),                           // 'p'
		"01ARZ3NDEKTSV4RRFFQ69G5FAV",           // a ULID of 2016: 'p'
		"order-42",                             // 't'
		"0198C1A2-7E31-7000-8000-00000000000A", // a UUIDv7 not in canonical form: 't'
	} {
		claim(part, "new", id)
	}
	var kinds string
	if err := db.Pool.QueryRow(ctx, "SELECT string_agg(DISTINCT kind::text, '' ORDER BY kind::text) FROM "+db.Table("exactly_keys2")).Scan(&kinds); err != nil || kinds != "7loptu" {
		t.Fatalf("kinds stored: %q (%v), want every compact form: 7loptu", kinds, err)
	}
	rows, err := db.Pool.Query(ctx, "SELECT scope, key, fingerprint, status, attempts, source_topic, source_partition, source_offset FROM "+
		keyview.SQL(keyview.Tables{Single: db.Table("exactly_keys"), Partitioned: db.Table("exactly_keys2"), Names: db.Table("exactly_key_names")}))
	if err != nil {
		t.Fatal(err)
	}
	var got []claimed
	for rows.Next() {
		var (
			c             claimed
			status, topic string
			attempts, p   int
			offset        int64
		)
		if err := rows.Scan(&c.scope, &c.id, &c.fp, &status, &attempts, &topic, &p, &offset); err != nil {
			t.Fatal(err)
		}
		if status != "COMPLETED" || attempts != 1 || topic != "topic-"+c.scope || p != 3 {
			t.Errorf("%s/%s: %s, %d attempts, %s[%d]", c.scope, c.id, status, attempts, topic, p)
		}
		got = append(got, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	less := func(s []claimed) func(i, j int) bool {
		return func(i, j int) bool { return s[i].scope+"/"+s[i].id < s[j].scope+"/"+s[j].id }
	}
	sort.Slice(want, less(want))
	sort.Slice(got, less(got))
	if len(got) != len(want) {
		t.Fatalf("got %d keys, want %d:\n%v\n%v", len(got), len(want), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("key %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

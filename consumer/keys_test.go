package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/pgstore"
)

// KeyFromTimeOrderedUUID takes the UUIDv7s and ULIDs that Watermill and
// google/uuid mint, in canonical form, and refuses random UUIDs.
func TestKeyFromTimeOrderedUUID(t *testing.T) {
	for i := 0; i < 200; i++ {
		v7 := uuid.Must(uuid.NewV7()).String()
		ulid := watermill.NewULID()
		for _, c := range []struct{ in, want string }{
			{v7, v7}, {strings.ToUpper(v7), v7}, {ulid, ulid}, {strings.ToLower(ulid), ulid},
		} {
			got, err := consumer.KeyFromTimeOrderedUUID(message.NewMessage(c.in, nil))
			if err != nil || got != c.want {
				t.Fatalf("KeyFromTimeOrderedUUID(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
		}
	}
	for _, random := range []string{watermill.NewUUID(), watermill.NewShortUUID(), "order-42"} {
		if _, err := consumer.KeyFromTimeOrderedUUID(message.NewMessage(random, nil)); !errors.Is(err, dedupe.ErrNotTimeOrdered) {
			t.Errorf("KeyFromTimeOrderedUUID(%q) = %v, want ErrNotTimeOrdered", random, err)
		}
	}
	if got, err := consumer.KeyFromTimeOrderedUUID(message.NewMessage("", nil)); got != "" || err != nil {
		t.Errorf("no UUID: %q, %v; want no key", got, err)
	}
	md := consumer.TimeOrderedKey(consumer.KeyFromMetadata("command_id"))
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set("command_id", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
	if got, err := md(m); err != nil || got != "01ARZ3NDEKTSV4RRFFQ69G5FAV" {
		t.Errorf("TimeOrderedKey(KeyFromMetadata) = %q, %v", got, err)
	}
}

// A random ID under KeyFromTimeOrderedUUID is an invalid key: the handler
// does not run, and nothing is stored.
func TestRandomIDRefusedByTimeOrderedKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "s", KeyFunc: consumer.KeyFromTimeOrderedUUID, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
	msg.SetContext(context.Background())
	if _, err := h(msg); !errors.Is(err, dedupe.ErrInvalidKey) || ran {
		t.Fatalf("random UUID: err %v, handler ran %v; want an invalid key and no run", err, ran)
	}
	if st, err := store.Stats(context.Background()); err != nil || st.Completed+st.Processing != 0 {
		t.Fatalf("stats %+v, %v: want no key stored", st, err)
	}
}

// Outputs with no UUID get a UUIDv7 before they are stored, so the first
// run and its duplicates publish the same, time-ordered, IDs.
func TestOutputsWithoutUUIDGetUUIDv7(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store, err := pgstore.New(db.Pool, &pgstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mw, err := consumer.NewMiddleware(store, &consumer.Config{Scope: "s", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("", []byte("out")), message.NewMessage("given", []byte("out2"))}, nil
	})
	id := watermill.NewUUID()
	var runs [2][]*message.Message
	for i := range runs {
		msg := message.NewMessage(id, []byte("p"))
		msg.SetContext(ctx)
		if runs[i], err = h(msg); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := store.Get(ctx, dedupe.Key{Scope: "s", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := consumer.StoredOutputs(rec.Result)
	if err != nil || len(stored) != 2 {
		t.Fatalf("stored outputs %v, %v", stored, err)
	}
	if p, err := dedupe.ParseTimeID(stored[0].UUID); err != nil || p.Kind != dedupe.UUIDv7 {
		t.Fatalf("stored output UUID %q: %v; want a UUIDv7", stored[0].UUID, err)
	}
	if stored[1].UUID != "given" {
		t.Fatalf("a given output UUID became %q", stored[1].UUID)
	}
	for i, run := range runs {
		if len(run) != 2 || run[0].UUID != stored[0].UUID || run[1].UUID != "given" {
			t.Fatalf("run %d published %v, want the stored UUIDs %q, given", i, run, stored[0].UUID)
		}
	}
}

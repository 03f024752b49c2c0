package replaycli_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

// A read model rebuilt with replay rebuild: the table truncated, the
// scope's keys retired and a new group recorded in one transaction, while
// the old group's worker still runs; the new group's worker refills the
// table from the topic's start, every command exactly once (those sent
// after the rebuild too, which both groups read), and the old group is
// refused at its next start.
func TestRebuildRefillsTheTableOnce(t *testing.T) {
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	url, _ := pgtest.URL()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	ctx := context.Background()
	applied := db.Table("applied")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const scope = "read-model"
	oldGroup, newGroup := kafkatest.Name("old"), kafkatest.Name("rebuild")
	start := func(group string) (func() error, error) {
		w, err := worker.New(db.Pool, &worker.Config{Scope: scope, Topic: topic, Group: group, Brokers: brokers, Schema: db.Schema,
			DeadLetterTopic: topic + ".dlq", CreateTopics: true, Logger: quiet(), StartupBackoff: 200 * time.Millisecond,
			Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
				_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID)
				return nil, err
			}})
		if err != nil {
			return nil, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(runCtx) }()
		select {
		case <-w.Running():
		case err := <-done:
			cancel()
			return nil, err
		}
		var stopped bool
		var runErr error
		stop := func() error {
			if !stopped {
				stopped = true
				cancel()
				runErr = <-done
			}
			return runErr
		}
		t.Cleanup(func() { _ = stop() })
		return stop, nil
	}
	send := func(ids ...string) {
		t.Helper()
		pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		for _, id := range ids {
			m := message.NewMessage(id, []byte(id))
			m.Metadata.Set(kafkapubsub.MetadataKafkaKey, id)
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(where string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+applied+" "+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	stopOld, err := start(oldGroup)
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for i := range 20 {
		before = append(before, fmt.Sprintf("before-%d", i))
	}
	send(before...)
	testenv.WaitFor(t, time.Minute, "the old group applied the commands", func() bool { return count("") == 20 })

	args := []string{"rebuild", "--brokers", strings.Join(brokers, ","), "--database-url", url, "--schema", db.Schema,
		"--scope", scope, "--topic", topic, "--group", newGroup, "--truncate", "applied"}
	code, out, errs := run(args...)
	if code != 0 || !strings.Contains(out, "keys retired   20") || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run: exit %d, %s%s", code, out, errs)
	}
	if n := count(""); n != 20 {
		t.Fatalf("the dry run changed the table: %d rows", n)
	}
	// The old group's worker still runs: the rebuild is safe with it.
	code, out, errs = run(append(args, "--execute")...)
	if code != 0 || !strings.Contains(out, "keys retired   20") || !strings.Contains(out, "before: "+oldGroup) {
		t.Fatalf("rebuild: exit %d, %s%s", code, out, errs)
	}
	if n := count(""); n != 0 {
		t.Fatalf("%d rows after the rebuild's truncate, want 0", n)
	}
	stopNew, err := start(newGroup)
	if err != nil {
		t.Fatal(err)
	}
	send("after-1", "after-2", "after-3")
	testenv.WaitFor(t, 2*time.Minute, "the table refilled", func() bool { return count("") == 23 })
	if err := stopNew(); err != nil {
		t.Fatal(err)
	}
	if err := stopOld(); err != nil {
		t.Fatal(err)
	}
	if n, twice := count(""), count("WHERE n <> 1"); n != 23 || twice != 0 {
		t.Fatalf("%d rows, %d applied more than once; want 23 and 0", n, twice)
	}
	// The old group is refused from now on, with the fix.
	_, err = start(oldGroup)
	var taken *pgstore.ScopeTakenError
	if !errors.As(err, &taken) || taken.Owner.Group != newGroup {
		t.Fatalf("the old group at its next start: %v; want a ScopeTakenError naming %s", err, newGroup)
	}
	// A group that consumed already is refused as the rebuilding group.
	if code, _, errs := run(append(args[:len(args)-2:len(args)-2], "--group", newGroup)...); code != 7 || !strings.Contains(errs, "committed offset") {
		t.Fatalf("a rebuild with a group that committed offsets: exit %d, %s", code, errs)
	}
}

package migrations_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// docBlocks returns the SQL blocks of the "Roles and grants" section of the
// package doc (indented lines) or of a Markdown page (```sql fences), one
// slice of statements per block.
func docBlocks(t *testing.T, path, heading string, markdown bool) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks [][]string
	in, inBlock := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !markdown {
			line = strings.TrimPrefix(strings.TrimPrefix(line, "//"), " ")
		}
		switch {
		case line == heading:
			in = true
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "#") || line == "package migrations":
			in = false
			continue
		}
		var stmt string
		var isCode bool
		if markdown {
			switch line {
			case "```sql":
				inBlock = true
				blocks = append(blocks, nil)
				continue
			case "```":
				inBlock = false
				continue
			}
			stmt, isCode = line, inBlock
		} else {
			stmt, isCode = strings.CutPrefix(line, "\t")
			if isCode && !inBlock {
				blocks = append(blocks, nil)
			}
			inBlock = isCode
		}
		if isCode && stmt != "" {
			blocks[len(blocks)-1] = append(blocks[len(blocks)-1], stmt)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 {
		t.Fatalf("%s: %d SQL blocks under %q, want 2 (the administrator's, the migrator's)", path, len(blocks), heading)
	}
	return blocks
}

// TestDocumentedGrants runs the statements of the "Roles and grants"
// sections (docs/grants.md and the package doc, which must agree) with names of its own,
// then: migrates as the migrator; as the consumer claims and completes keys
// (Do, a duplicate, ClaimTx and CompleteTx, DoLease, a failing DoLease,
// Stats) on the default key layout and writes to the outbox in the same transactions; as the relay publishes through a
// Watermill publisher, sleeps as a registered waiter, is woken by the
// consumer's next commit and publishes again; the key clean-up, refused to
// the consumer, runs as the migrator. It checks the rows each step
// leaves, and that neither the consumer nor the relay can do more than it
// needs (no DDL, no reading what is not theirs).
func TestDocumentedGrants(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	blocks := docBlocks(t, "doc.go", "# Roles and grants", false)
	if page := docBlocks(t, "../docs/grants.md", "## Roles and grants", true); !slices.EqualFunc(blocks, page, slices.Equal) {
		t.Fatalf("docs/grants.md and the package doc disagree:\n%q\n%q", page, blocks)
	}

	schema := randomName("t_")
	names := map[string]string{
		"ledger":          schema,
		"ledger_migrator": randomName("t_migrator_"),
		"ledger_consumer": randomName("t_consumer_"),
		"ledger_relay":    randomName("t_relay_"),
	}
	rename := regexp.MustCompile(`\bledger(_migrator|_consumer|_relay)?\b`)
	sql := func(stmt string) string {
		return rename.ReplaceAllStringFunc(stmt, func(s string) string { return names[s] })
	}
	migrator, consumer, relay := names["ledger_migrator"], names["ledger_consumer"], names["ledger_relay"]
	dropRolesAtEnd(t, adm, migrator, consumer, relay)
	for _, stmt := range blocks[0] {
		exec(t, adm, sql(stmt))
	}
	migPool := connectAs(t, adm, migrator)
	conPool := connectAs(t, adm, consumer)
	relPool := connectAs(t, adm, relay)

	if err := migrations.Migrate(ctx, migPool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatalf("migrate as the migrator: %v", err)
	}
	for _, stmt := range blocks[1] {
		exec(t, migPool, sql(stmt))
	}
	count := func(query string) int {
		t.Helper()
		var n int
		if err := adm.QueryRow(ctx, strings.ReplaceAll(query, "{S}", schema)).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}

	// The key clean-up's process, as the migrator: its start-up check
	// creates the first partitions.
	maint, err := pgstore.New(migPool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := maint.Check(ctx); err != nil {
		t.Fatalf("the key clean-up's start as the migrator: %v", err)
	}

	// The consumer.
	store, err := pgstore.New(conPool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	writer, err := outbox.NewWriter(&outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const topic = "events"
	runs := 0
	consume := func(id string) dedupe.Claim {
		t.Helper()
		key, err := dedupe.NewKey("ledger", id)
		if err != nil {
			t.Fatal(err)
		}
		c, err := store.Do(ctx, dedupe.Request{Key: key, Fingerprint: dedupe.FingerprintOf([]byte(id))},
			func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				runs++
				return []byte("ok " + id), writer.WriteTx(ctx, tx, topic, message.NewMessage("out-"+id, []byte(id)))
			})
		if err != nil {
			t.Fatalf("consume %s as the consumer: %v", id, err)
		}
		return c
	}
	if c := consume("cmd-1"); c.Decision != dedupe.DecisionNew || runs != 1 {
		t.Fatalf("first delivery: %v, %d runs", c.Decision, runs)
	}
	if c := consume("cmd-1"); c.Decision != dedupe.DecisionDuplicate || runs != 1 || string(c.Record.Result) != "ok cmd-1" {
		t.Fatalf("redelivery: %v %q, %d runs", c.Decision, c.Record.Result, runs)
	}
	// The claim in a transaction of the caller's (dedupe.Store's ClaimTx
	// and CompleteTx), with an outbox write in it.
	txKey, _ := dedupe.NewKey("ledger", "cmd-tx")
	tx, err := conPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.ClaimTx(ctx, tx, dedupe.Request{Key: txKey, Fingerprint: dedupe.FingerprintOf([]byte("cmd-tx"))})
	if err != nil || c.Decision != dedupe.DecisionNew {
		t.Fatalf("ClaimTx as the consumer: %v %v", c.Decision, err)
	}
	if err := writer.WriteTx(ctx, tx, topic, message.NewMessage("out-cmd-tx", []byte("cmd-tx"))); err != nil {
		t.Fatalf("WriteTx as the consumer: %v", err)
	}
	if err := store.CompleteTx(ctx, tx, c, []byte("ok cmd-tx")); err != nil {
		t.Fatalf("CompleteTx as the consumer: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit as the consumer: %v", err)
	}
	leaseKey, _ := dedupe.NewKey("payments", "pay-1")
	leaseReq := dedupe.Request{Key: leaseKey, Fingerprint: dedupe.FingerprintOf([]byte("pay-1"))}
	boom := errors.New("payment API down")
	if _, err := store.DoLease(ctx, leaseReq, time.Minute, func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) || strings.Contains(err.Error(), "release") {
		t.Fatalf("failing DoLease as the consumer: %v (want the function's error, the key released)", err)
	}
	if c, err := store.DoLease(ctx, leaseReq, time.Minute, func(context.Context) ([]byte, error) { return []byte("paid"), nil }); err != nil || c.Record.Status != dedupe.StatusCompleted {
		t.Fatalf("DoLease as the consumer: %v %v", c.Decision, err)
	}
	// The key clean-up runs DDL: refused to the consumer, run by the
	// migrator.
	if err := store.CheckMaintenance(ctx); !errors.Is(err, dedupe.ErrMisconfigured) {
		t.Fatalf("the consumer's right to run the key clean-up: %v, want a misconfiguration", err)
	}
	if err := maint.CheckMaintenance(ctx); err != nil {
		t.Fatalf("the migrator's right to run the key clean-up: %v", err)
	}
	if _, err := maint.Cleanup(ctx, nil); err != nil {
		t.Fatalf("cleanup as the migrator: %v", err)
	}
	if _, err := store.Stats(ctx); err != nil {
		t.Fatalf("stats as the consumer: %v", err)
	}
	positions := store.Positions()
	for _, offsets := range []map[int]int64{{0: 3, 1: 5}, {0: 4}} { // an insert, then an update
		if _, err := positions.Save(ctx, "ledger", topic, offsets, nil); err != nil {
			t.Fatalf("save positions as the consumer: %v", err)
		}
	}
	if got, err := positions.Load(ctx, "ledger", topic, []int{0, 1}); err != nil || got[0] != 4 || got[1] != 5 {
		t.Fatalf("load positions as the consumer: %v %v, want 0:4 1:5", got, err)
	}
	// A Subscriber claims its partitions and fences its saves.
	if got, epochs, err := positions.Claim(ctx, "ledger", topic, []int{0, 1}); err != nil || got[0] != 4 || epochs[0] <= 0 {
		t.Fatalf("claim positions as the consumer: %v %v %v, want 0:4 and an epoch", got, epochs, err)
	} else if _, lost, err := positions.SaveClaimed(ctx, "ledger", topic, map[int]int64{0: 6}, map[int]int64{0: 4}, epochs); err != nil || lost != nil {
		t.Fatalf("save claimed positions as the consumer: %v %v", lost, err)
	}
	// A worker records its group for its scope and topic at start, and
	// takes a scope over with worker.Config.TakeOver.
	if _, err := store.RegisterScope(ctx, "ledger", topic, "ledger", false); err != nil {
		t.Fatalf("register the scope as the consumer: %v", err)
	}
	if prev, err := store.RegisterScope(ctx, "ledger", topic, "ledger-2", true); err != nil || prev.Group != "ledger" {
		t.Fatalf("take the scope over as the consumer: %v %v", prev, err)
	}
	for _, want := range []struct {
		key      dedupe.Key
		attempts int
		result   string
	}{{dedupe.Key{Scope: "ledger", ID: "cmd-1"}, 1, "ok cmd-1"}, {txKey, 1, "ok cmd-tx"}, {leaseKey, 2, "paid"}} {
		rec, err := maint.Get(ctx, want.key)
		if err != nil || rec.Status != dedupe.StatusCompleted || rec.Attempts != want.attempts || string(rec.Result) != want.result {
			t.Fatalf("key %s: %+v %v, want completed after %d attempts with %q", want.key, rec, err, want.attempts, want.result)
		}
	}
	if n := count("SELECT count(*) FROM {S}.exactly_keys"); n != 0 {
		t.Fatalf("%d keys in the single table, want 0: the default layout is the partitioned one", n)
	}
	if n := count("SELECT count(*) FROM {S}.exactly_outbox WHERE status = 'PENDING' AND uuid IN ('out-cmd-1', 'out-cmd-tx')"); n != 2 {
		t.Fatalf("%d pending outbox rows for out-cmd-1 and out-cmd-tx, want 2", n)
	}

	// The relay.
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pubsub.Close()
	received, err := pubsub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(relPool, pubsub, &outbox.RelayConfig{Config: outbox.Config{Schema: schema},
		PollInterval: time.Hour}) // only a notification wakes it
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	var runErr error
	stopRelay := sync.OnceFunc(func() { stop(); runErr = <-done })
	defer stopRelay()
	receive := func() string {
		t.Helper()
		select {
		case m := <-received:
			m.Ack()
			return m.UUID
		case <-time.After(30 * time.Second):
			t.Fatal("the relay did not publish")
			return ""
		}
	}
	got := []string{receive(), receive()}
	slices.Sort(got)
	if !slices.Equal(got, []string{"out-cmd-1", "out-cmd-tx"}) {
		t.Fatalf("published %v, want out-cmd-1 and out-cmd-tx", got)
	}
	testenv.WaitFor(t, 30*time.Second, "the relay to mark both published", func() bool {
		return count("SELECT count(*) FROM {S}.exactly_outbox WHERE status = 'PUBLISHED'") == 2
	})
	testenv.WaitFor(t, 30*time.Second, "the relay to register as a waiter", func() bool {
		return count("SELECT count(*) FROM {S}.exactly_outbox_waiters") == 1
	})
	consume("cmd-2") // its commit notifies the sleeping relay
	if uuid := receive(); uuid != "out-cmd-2" {
		t.Fatalf("published %s, want out-cmd-2", uuid)
	}
	testenv.WaitFor(t, 30*time.Second, "the relay to mark out-cmd-2 published", func() bool {
		return count("SELECT count(*) FROM {S}.exactly_outbox WHERE status = 'PUBLISHED'") == 3
	})
	if _, err := r.Cleanup(ctx); err != nil {
		t.Fatalf("relay cleanup as the relay: %v", err)
	}
	if _, err := r.Stats(ctx); err != nil {
		t.Fatalf("relay stats as the relay: %v", err)
	}
	stopRelay()
	if runErr != nil {
		t.Fatalf("relay: %v", runErr)
	}
	if n := count("SELECT count(*) FROM {S}.exactly_outbox_waiters"); n != 0 {
		t.Fatalf("%d waiters left after the relay stopped, want 0", n)
	}

	// Nothing more than that.
	for _, c := range []struct {
		who  string
		pool *pgxpool.Pool
		stmt string
	}{
		{"consumer", conPool, "CREATE TABLE {S}.x (id int)"},
		{"relay", relPool, "CREATE TABLE {S}.x (id int)"},
		{"consumer", conPool, "SELECT FROM {S}.exactly_outbox"},
		{"consumer", conPool, "SELECT FROM {S}.exactly_outbox_waiters"},
		{"relay", relPool, "SELECT FROM {S}.exactly_keys"},
		{"relay", relPool, "SELECT FROM {S}.exactly_keys2"},
		{"consumer", conPool, "DELETE FROM {S}.exactly_keys2_state"},
		{"consumer", conPool, "DELETE FROM {S}.exactly_keys"},
		{"relay", relPool, "SELECT FROM {S}.exactly_positions"},
		{"consumer", conPool, "DELETE FROM {S}.exactly_positions"},
		{"relay", relPool, "INSERT INTO {S}.exactly_outbox (topic, uuid, payload, lane) VALUES ('t', 'u', '', 0)"},
	} {
		if _, err := c.pool.Exec(ctx, strings.ReplaceAll(c.stmt, "{S}", schema)); !denied(err) {
			t.Errorf("%s: %s: err = %v, want permission denied", c.who, c.stmt, err)
		}
	}
}

// TestUpgradeGivesClaimsThePositionsGrants: a deployment migrated before
// 00013 granted its consumer exactly_positions only; the migration that
// adds the claims gives them the same grants, so the consumer's upgraded
// Subscriber claims and saves with no new grant.
func TestUpgradeGivesClaimsThePositionsGrants(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	migrator, consumer := randomName("t_migrator_"), randomName("t_consumer_")
	newRole(t, adm, migrator)
	newRole(t, adm, consumer)
	schema := randomName("t_")
	exec(t, adm, "CREATE SCHEMA "+schema+" AUTHORIZATION "+migrator)
	migPool := connectAs(t, adm, migrator)
	conPool := connectAs(t, adm, consumer)
	if err := migrations.Migrate(ctx, migPool, &migrations.Config{Schema: schema, Version: 12}); err != nil {
		t.Fatal(err)
	}
	exec(t, migPool, "GRANT USAGE ON SCHEMA "+schema+" TO "+consumer,
		"GRANT SELECT, INSERT, UPDATE ON "+schema+".exactly_positions TO "+consumer)
	if err := migrations.Migrate(ctx, migPool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	positions, err := pgstore.NewPositions(conPool, &pgstore.PositionsConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	_, epochs, err := positions.Claim(ctx, "g", "t", []int{0})
	if err != nil {
		t.Fatalf("claim as the consumer granted exactly_positions before 00013: %v", err)
	}
	if _, lost, err := positions.SaveClaimed(ctx, "g", "t", map[int]int64{0: 3}, map[int]int64{}, epochs); err != nil || lost != nil {
		t.Fatalf("save claimed positions as that consumer: %v %v", lost, err)
	}
	if _, err := conPool.Exec(ctx, "DELETE FROM "+schema+".exactly_positions_claims"); !denied(err) {
		t.Fatalf("DELETE on the claims as that consumer: %v, want it denied (it had no DELETE on exactly_positions)", err)
	}
}

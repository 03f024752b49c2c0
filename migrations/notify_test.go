package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/migrations"
)

// TestOutboxProducerInsertOnly: a producer granted only INSERT on the
// outbox and USAGE on its sequence commits its rows, both when no relay
// waits (the trigger finds no waiter) and when one does (the trigger
// notifies, and the notification arrives, though the producer's session has
// a temporary table of the waiters table's name). It still cannot read the
// waiters table nor call the trigger's function itself.
func TestOutboxProducerInsertOnly(t *testing.T) {
	adm := admin(t)
	ctx := context.Background()
	owner, producer := randomName("t_owner_"), randomName("t_producer_")
	newRole(t, adm, owner)
	newRole(t, adm, producer)
	schema := randomName("t_")
	exec(t, adm, "CREATE SCHEMA "+schema+" AUTHORIZATION "+owner)
	t.Cleanup(func() { _, _ = adm.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	ownerPool := connectAs(t, adm, owner)
	if err := migrations.Migrate(ctx, ownerPool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	exec(t, ownerPool,
		"GRANT USAGE ON SCHEMA "+schema+" TO "+producer,
		"GRANT INSERT ON "+schema+".exactly_outbox TO "+producer,
		"GRANT USAGE ON SEQUENCE "+schema+".exactly_outbox_id_seq TO "+producer)
	prod := connectAs(t, adm, producer)
	// The producer's session has a temporary table named like the waiters
	// table, empty: the trigger must read the real one.
	conn, err := prod.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "CREATE TEMP TABLE exactly_outbox_waiters (relay text, expires_at timestamptz)"); err != nil {
		t.Fatal(err)
	}

	insert := func(uuid string) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".exactly_outbox (topic, uuid, payload, lane) VALUES ('t', $1, 'p', 0)", uuid); err != nil {
			return err
		}
		return tx.Commit(ctx) // the deferred trigger runs here
	}
	if err := insert("no-waiter"); err != nil {
		t.Fatalf("commit with no relay waiting: %v", err)
	}

	// A relay waits: it listens and is registered.
	listener, err := adm.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = listener.Exec(context.Background(), "UNLISTEN *")
		listener.Release()
	}()
	exec(t, adm, "INSERT INTO "+schema+".exactly_outbox_waiters (relay, expires_at) VALUES ('test', now() + interval '1 hour')")
	if _, err := listener.Exec(ctx, "LISTEN exactly_outbox"); err != nil {
		t.Fatal(err)
	}
	if err := insert("waiter"); err != nil {
		t.Fatalf("commit with a relay waiting: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		n, err := listener.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification for %s.exactly_outbox: %v", schema, err)
		}
		if n.Payload == schema+".exactly_outbox" {
			break // others' tests notify on the same channel
		}
	}

	var uuids string
	if err := adm.QueryRow(ctx, "SELECT string_agg(uuid, ',' ORDER BY id) FROM "+schema+".exactly_outbox").Scan(&uuids); err != nil || uuids != "no-waiter,waiter" {
		t.Fatalf("outbox rows %q (%v), want no-waiter,waiter", uuids, err)
	}
	if _, err := prod.Exec(ctx, "SELECT FROM "+schema+".exactly_outbox_waiters"); !denied(err) {
		t.Fatalf("producer reads the waiters table: err = %v, want permission denied", err)
	}
	var canExecute bool
	if err := adm.QueryRow(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE')", producer, pgx.Identifier{schema, "exactly_outbox_notify"}.Sanitize()+"()").Scan(&canExecute); err != nil || canExecute {
		t.Fatalf("producer may execute the trigger function: %v (%v)", canExecute, err)
	}
}

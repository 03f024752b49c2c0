package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The restore fault: the ledger's database goes back to a moment before
// any partition's first position save (a restore of a backup taken before
// the workers started, or an asynchronous standby promoted that never
// received those saves). Every worker is killed, as the clients of a
// failed-over or restored database lose their sessions; the ledger schema
// is put back to the snapshot taken after the migration, before the first
// worker started (its rows, not its DDL); the workers start again. Their
// positions are gone while Kafka's committed offsets, made with positions,
// are past everything the database kept: each partition must start again
// at the oldest record Kafka holds and apply every command once more, into
// the restored (empty) ledger. The audit then finds 0 lost and 0 doubled
// only if nothing was skipped.

// snapshotSchema is where the snapshot of the ledger schema is kept.
const snapshotSchema = "chaos_snapshot"

// ledgerTables lists the ledger schema's tables (partitioned parents, not
// their partitions), but exactly_keys2_state: the key layout's state
// describes its partitions, which a restore of rows leaves as they are (a
// restore of a whole backup brings both back together).
func ledgerTables(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'ledger' AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname <> 'exactly_keys2_state'
ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// snapshotLedger copies every table of the ledger schema into
// snapshotSchema.
func snapshotLedger(ctx context.Context, pool *pgxpool.Pool) error {
	tables, err := ledgerTables(ctx, pool)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	stmts := []string{"DROP SCHEMA IF EXISTS " + snapshotSchema + " CASCADE", "CREATE SCHEMA " + snapshotSchema}
	for _, t := range tables {
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE %s AS SELECT * FROM %s", pgx.Identifier{snapshotSchema, t}.Sanitize(), pgx.Identifier{"ledger", t}.Sanitize()))
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("snapshot: %s: %w", s, err)
		}
	}
	return nil
}

// restoreLedger puts every table of the ledger schema back to the
// snapshot, in one transaction.
func restoreLedger(ctx context.Context, pool *pgxpool.Pool) error {
	tables, err := ledgerTables(ctx, pool)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// The killed workers' backends may still be running a statement, each
	// holding locks of its transaction until it notices its client gone;
	// the TRUNCATE of every table can deadlock with one of them, and is
	// run again then.
	for try := 1; ; try++ {
		err := restoreOnce(ctx, pool, tables)
		var pgErr *pgconn.PgError
		if err == nil || try == 5 || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return err
		}
		time.Sleep(200 * time.Millisecond) // the other side of the deadlock rolls back
	}
}

func restoreOnce(ctx context.Context, pool *pgxpool.Pool, tables []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		names := make([]string, len(tables))
		for i, t := range tables {
			names[i] = pgx.Identifier{"ledger", t}.Sanitize()
		}
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(names, ", ")); err != nil {
			return fmt.Errorf("restore: truncate: %w", err)
		}
		for i, t := range tables {
			snap := pgx.Identifier{snapshotSchema, t}.Sanitize()
			// An empty table stays as TRUNCATE left it: an INSERT, even of
			// no row, would fire the single table's insert guard, which
			// refuses every insert once the partitioned layout started.
			var empty bool
			if err := tx.QueryRow(ctx, "SELECT NOT EXISTS (SELECT FROM "+snap+")").Scan(&empty); err != nil {
				return fmt.Errorf("restore: %s: %w", t, err)
			}
			if empty {
				continue
			}
			q := fmt.Sprintf("INSERT INTO %s OVERRIDING SYSTEM VALUE SELECT * FROM %s", names[i], snap)
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("restore: %s: %w", t, err)
			}
		}
		return nil
	})
}

// restore runs the restore fault: every worker killed, the ledger put
// back to the snapshot, every worker started again.
func (c *chaosRun) restore(ctx context.Context) {
	c.ws.mu.Lock() // no respawn in between
	defer c.ws.mu.Unlock()
	for _, w := range c.ws.all {
		if w.alive() {
			w.kill()
		}
	}
	if err := restoreLedger(ctx, c.pool); err != nil {
		c.t.Error(err)
	}
	for _, w := range c.ws.all {
		if !w.alive() {
			if err := c.ws.start(w); err != nil {
				c.t.Error(err)
			} else {
				c.n.workerRestarts.Add(1)
			}
		}
	}
	c.n.restores.Add(1)
}

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/systest/pgcluster"
)

// CHAOS_POOLER=1 puts PgBouncer (Debian's package, run by
// scripts/pgbouncer.sh) in transaction mode between the workers and the
// suite's Postgres, as a deployment behind a transaction pooler has it
// (docs/deployments.md, "Behind a connection pooler"): the workers connect
// with default_query_exec_mode=exec, any server connection serves any of
// their transactions, and the pooler stays up while Postgres is restarted,
// paused and restored under it. The migrations, the audit and the faults
// connect to Postgres directly. The run fails unless the pooler served at
// least a transaction per batch of commands.

// chaosPassword is the postgres role's password on the suite's Postgres
// when a pooler runs in front of it: PgBouncer logs clients in with SCRAM
// (the server itself trusts local connections).
const chaosPassword = "chaos"

// pgBouncer is a PgBouncer of the suite's own in front of its Postgres.
type pgBouncer struct {
	script string
	env    []string
	url    string // the pooler's URL, as scripts/pgbouncer.sh printed it
	port   int
}

// startPgBouncer starts a PgBouncer in transaction mode on a free port in
// front of the Postgres on pgPort, and stops it when t ends.
func startPgBouncer(ctx context.Context, t testing.TB, root, base string, pgPort int) (*pgBouncer, error) {
	direct := fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", chaosPassword, pgPort)
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		return nil, fmt.Errorf("chaos: pooler: connect to Postgres: %w", err)
	}
	_, err = conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+chaosPassword+"'")
	_ = conn.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: pooler: set the postgres role's password: %w", err)
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		return nil, err
	}
	b := &pgBouncer{script: filepath.Join(root, "scripts", "pgbouncer.sh"), port: port,
		env: append(os.Environ(), "TEST_DATABASE_URL="+direct, fmt.Sprintf("PGBOUNCER_PORT=%d", port),
			"PGBOUNCER_MODE=transaction", "PGBOUNCER_RUN_DIR="+filepath.Join(base, "pgbouncer"))}
	out, err := b.do("start")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _, _ = b.do("stop") })
	b.url = strings.TrimSpace(out)
	if !strings.HasPrefix(b.url, "postgres://") {
		return nil, fmt.Errorf("chaos: pooler: scripts/pgbouncer.sh start printed %q, not a URL", b.url)
	}
	return b, nil
}

func (b *pgBouncer) do(cmd string) (string, error) {
	c := exec.Command(b.script, cmd)
	c.Env = b.env
	var stderr strings.Builder
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return "", fmt.Errorf("chaos: scripts/pgbouncer.sh %s: %v\n%s", cmd, err, stderr.String())
	}
	return string(out), nil
}

// workerURL is the URL the workers connect with: through the pooler, in a
// QueryExecMode that keeps no statement on a server connection.
func (b *pgBouncer) workerURL() string {
	return b.url + "&default_query_exec_mode=exec"
}

// transactions is how many transactions the pooler served for the
// postgres database, read from its admin console.
func (b *pgBouncer) transactions(ctx context.Context) (int64, error) {
	admin := strings.Replace(b.url, "/postgres?", "/pgbouncer?", 1) + "&default_query_exec_mode=simple_protocol"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return 0, fmt.Errorf("chaos: pooler: connect to its admin console: %w", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, "SHOW STATS")
	if err != nil {
		return 0, fmt.Errorf("chaos: pooler: SHOW STATS: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		// The console answers in text, in types of its own.
		vals := rows.RawValues()
		if len(vals) == 0 || string(vals[0]) != "postgres" {
			continue
		}
		for i, fd := range rows.FieldDescriptions() {
			if fd.Name == "total_xact_count" {
				var n int64
				_, err := fmt.Sscan(string(vals[i]), &n)
				return n, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("chaos: pooler: SHOW STATS has no total_xact_count for the postgres database")
}

// check fails the run unless the pooler served at least one transaction
// per batch of commands (batch is the largest batch, 1 per message): else
// the workers did not go through it.
func (b *pgBouncer) check(ctx context.Context, f *findings, batch int) string {
	n, err := b.transactions(ctx)
	if err != nil {
		f.fail("pooler", "%v", err)
		return "unread"
	}
	if least := int64(f.commands / max(batch, 1)); n < least {
		f.fail("pooler", "PgBouncer served %d transactions for %d commands (at least %d, batches of up to %d): the workers did not go through it",
			n, f.commands, least, max(batch, 1))
	}
	return fmt.Sprintf("PgBouncer (transaction mode) served %d transactions", n)
}

package ledgertest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// ledgerWorld runs the ledger worker on its own schema and topics, with a
// workload consumed to the end.
type ledgerWorld struct {
	db       *pgtest.DB
	url      string
	brokers  []string
	commands string
	dlq      string
	group    string
	cfg      ledger.Config
	wl       ledger.Workload
	stop     func()
}

func newLedger(t *testing.T, noDedupe bool) *ledgerWorld {
	t.Helper()
	return newLedgerWith(t, func(c *ledger.Config) { c.NoDedupe = noDedupe })
}

func newLedgerWith(t *testing.T, configure func(*ledger.Config)) *ledgerWorld {
	t.Helper()
	kafkatest.RequireReal(t)
	lw := &ledgerWorld{db: pgtest.NewEmpty(t), brokers: kafkatest.Brokers(t)}
	lw.url, _ = pgtest.URL()
	ctx := context.Background()
	if err := ledger.Migrate(ctx, lw.db.Pool, lw.db.Schema, nil); err != nil {
		t.Fatal(err)
	}
	lw.commands, lw.dlq = kafkatest.Topic(t, 3), kafkatest.Topic(t, 1)
	lw.group = kafkatest.Name("ledger")
	var err error
	lw.wl, err = ledger.Generate(ledger.LoadConfig{Commands: 300, Accounts: 20, Duplicates: 0.1, KeyReuse: 0.02, Malformed: 0.02, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Produce(ctx, lw.brokers, lw.commands, lw.wl.Records); err != nil {
		t.Fatal(err)
	}
	lw.cfg = ledger.Config{Schema: lw.db.Schema, Brokers: lw.brokers, Commands: lw.commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: lw.dlq, Group: lw.group, Logger: quiet()}
	configure(&lw.cfg)
	lw.start(t)
	t.Cleanup(func() { lw.stop() })
	lw.waitCaughtUp(t)
	return lw
}

// start runs a worker until stop.
func (lw *ledgerWorld) start(t *testing.T) {
	t.Helper()
	w, err := ledger.NewWorker(lw.db.Pool, lw.cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	var once sync.Once
	lw.stop = func() { once.Do(func() { cancel(); <-done }) }
}

func (lw *ledgerWorld) waitCaughtUp(t *testing.T) {
	t.Helper()
	end := kafkatest.EndOffsets(t, lw.commands, 3)
	testenv.WaitFor(t, 2*time.Minute, "the ledger worker to catch up", func() bool {
		got := kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)
		for p, o := range end {
			if got[p] != o {
				return false
			}
		}
		return true
	})
}

func (lw *ledgerWorld) checksumSQL() string {
	return "SELECT id, available, held FROM " + pgx.Identifier{lw.db.Schema, "accounts"}.Sanitize() + " ORDER BY id"
}

// run runs the CLI and returns its exit code, stdout and stderr.
func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := replaycli.Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func (lw *ledgerWorld) verifyArgs(extra ...string) []string {
	return append([]string{"verify", "--json", "--brokers", lw.brokers[0], "--topic", lw.commands, "--group", lw.group,
		"--database-url", lw.url, "--checksum-sql", lw.checksumSQL(), "--scope", ledger.Scope, "--schema", lw.db.Schema,
		"--timeout", "2m"}, extra...)
}

func (lw *ledgerWorld) verify(t *testing.T, extra ...string) (int, replaycli.VerifyReport, string) {
	t.Helper()
	code, out, errs := run(lw.verifyArgs(extra...)...)
	var rep replaycli.VerifyReport
	if out != "" {
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("report is not JSON: %v\n%s", err, out)
		}
	}
	return code, rep, errs
}

// Replaying the whole topic twice into a deduplicating consumer: verify
// passes, every tracked record deduplicated, nothing re-applied.
func TestVerifyPassesWithDedupe(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, false)
	code, rep, errs := lw.verify(t, "--duplicate", "2")
	if code != replaycli.ExitOK || !rep.Pass || rep.ReApplied != 0 || rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
	if rep.Replayed == 0 || rep.Deduplicated != rep.Replayed-rep.Untracked-rep.KeyReused || rep.Deduplicated == 0 || rep.ExpiredKeys != 0 {
		t.Fatalf("report %+v", rep)
	}
}

// --mutate: same UUIDs, changed payloads: the consumer reports key reuse
// (to its dead-letter topic) and applies nothing.
func TestVerifyMutateCountsKeyReuse(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, false)
	dlqBefore := kafkatest.EndOffsets(t, lw.dlq, 1)[0]
	code, rep, errs := lw.verify(t, "--mutate", "--ttl", "1ms")
	if code != replaycli.ExitOK || !rep.Pass || rep.KeyReused == 0 || rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
	if rep.ExpiredKeys != rep.Copy.Read || !strings.Contains(errs, "older than the key TTL") {
		t.Fatalf("records older than the TTL: %d of %d, warning %q", rep.ExpiredKeys, rep.Copy.Read, errs)
	}
	if dlq := kafkatest.EndOffsets(t, lw.dlq, 1)[0] - dlqBefore; dlq < rep.KeyReused {
		t.Fatalf("%d new dead letters for %d key reuses", dlq, rep.KeyReused)
	}
}

// A consumer with the dedupe middleware switched off: verify FAILS.
func TestVerifyCatchesConsumerWithoutDedupe(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, true)
	code, rep, errs := lw.verify(t)
	if code != replaycli.ExitDoubleApply || rep.Pass || !rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
}

// Keys gone (cleaned up after their TTL) before a replay: the replayed
// records apply again, and verify names them.
func TestVerifyCatchesExpiredKeys(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, false)
	lw.db.DeleteKeys(t, "")
	code, rep, errs := lw.verify(t)
	if code != replaycli.ExitDoubleApply || rep.Pass || rep.ReApplied == 0 {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
}

func TestRewind(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, false)
	base := []string{"rewind", "--brokers", lw.brokers[0], "--group", lw.group, "--topic", lw.commands, "--back", "5"}
	if code, _, errs := run(base...); code != replaycli.ExitGroupActive {
		t.Fatalf("rewind of an active group: exit %d\n%s", code, errs)
	}
	lw.stop()
	before := kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)
	code, out, errs := run(base...)
	if code != replaycli.ExitOK || fmt.Sprint(kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)) != fmt.Sprint(before) {
		t.Fatalf("dry run: exit %d, offsets changed\n%s%s", code, out, errs)
	}
	if code, out, errs := run(append(base, "--execute")...); code != replaycli.ExitOK {
		t.Fatalf("execute: exit %d\n%s%s", code, out, errs)
	}
	after := kafkatest.CommittedOffsets(t, lw.group, lw.commands, 3)
	for p, o := range before {
		if after[p] != max(o-5, 0) {
			t.Fatalf("partition %d: %d -> %d, want back by 5", p, o, after[p])
		}
	}
}

// Bad input: a clear message and a distinct exit code; nothing written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	topic := kafkatest.Topic(t, 1)
	db := pgtest.NewEmpty(t)
	if _, err := db.Pool.Exec(context.Background(), "CREATE TABLE "+db.Table("t")+" (x int)"); err != nil {
		t.Fatal(err)
	}
	verify := func(extra ...string) []string {
		return append([]string{"verify", "--brokers", brokers[0], "--topic", topic, "--group", kafkatest.Name("nobody"),
			"--database-url", url, "--checksum-sql", "SELECT x FROM " + db.Table("t")}, extra...)
	}
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"no command", nil, replaycli.ExitUsage},
		{"unknown command", []string{"frobnicate"}, replaycli.ExitUsage},
		{"missing flags", []string{"copy", "--brokers", brokers[0]}, replaycli.ExitUsage},
		{"unknown topic", []string{"copy", "--brokers", brokers[0], "--from", kafkatest.Name("missing"), "--to", topic, "--dry-run"}, replaycli.ExitUnknownTopic},
		{"empty range", []string{"copy", "--brokers", brokers[0], "--from", topic, "--to", topic, "--into-source", "--dry-run"}, replaycli.ExitEmptyRange},
		{"unreachable broker", []string{"copy", "--brokers", "127.0.0.1:1", "--from", topic, "--to", "x"}, replaycli.ExitKafka},
		{"unknown group", verify(), replaycli.ExitUnknownGroup},
		{"unreachable database", verify("--database-url", "postgres://u:secret@127.0.0.1:1/db"), replaycli.ExitDatabase},
		{"bad time", []string{"copy", "--brokers", brokers[0], "--from", topic, "--from-time", "yesterday"}, replaycli.ExitUsage},
	}
	for _, c := range cases {
		code, out, errs := run(c.args...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", c.name, code, c.code, out, errs)
		}
		if bytes.Contains([]byte(out+errs), []byte("secret")) {
			t.Errorf("%s: the password leaked: %s", c.name, errs)
		}
		if code != 0 && errs == "" {
			t.Errorf("%s: no message", c.name)
		}
	}
	// A checksum query that fails: an existing group is needed first.
	lw := newLedger(t, false)
	code, _, errs := run("verify", "--brokers", brokers[0], "--topic", lw.commands, "--group", lw.group,
		"--database-url", url, "--checksum-sql", "SELECT nope FROM nowhere")
	if code != replaycli.ExitChecksum {
		t.Errorf("bad checksum query: exit %d\n%s", code, errs)
	}
	if end := kafkatest.EndOffsets(t, topic, 1)[0]; end != 0 {
		t.Errorf("bad input wrote %d records", end)
	}
}

// A group that lags when verify starts is no double application: verify
// waits for it to catch up before it takes the "before" checksum.
func TestVerifyWaitsForALaggingGroup(t *testing.T) {
	t.Parallel()
	lw := newLedger(t, false)
	lw.stop()
	more, err := ledger.Generate(ledger.LoadConfig{Commands: 200, Accounts: 20, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Produce(context.Background(), lw.brokers, lw.commands, more.Records); err != nil {
		t.Fatal(err)
	}
	app := kafkatest.Name("verify")
	sep := "?"
	if strings.Contains(lw.url, "?") {
		sep = "&"
	}
	type result struct {
		code int
		rep  replaycli.VerifyReport
		errs string
	}
	res := make(chan result, 1)
	go func() {
		code, out, errs := run(lw.verifyArgs("--database-url", lw.url+sep+"application_name="+app)...)
		var rep replaycli.VerifyReport
		_ = json.Unmarshal([]byte(out), &rep)
		res <- result{code, rep, errs}
	}()
	// Once verify is connected, the consumer comes back and works off its lag.
	testenv.WaitFor(t, time.Minute, "verify to connect", func() bool {
		var n int
		_ = lw.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
		return n > 0
	})
	lw.start(t)
	r := <-res
	if r.code != replaycli.ExitOK || !r.rep.Pass || r.rep.ReApplied != 0 || r.rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", r.code, r.rep, r.errs)
	}
}

// A consumer keyed by a JSON field with JSON fingerprints: verify, told so,
// finds its keys, counts the replayed key reuses and nothing else as reused.
func TestVerifyWithTheConsumersKeyAndFingerprint(t *testing.T) {
	t.Parallel()
	lw := newLedgerWith(t, func(c *ledger.Config) {
		c.KeyFunc, c.FingerprintFunc = consumer.KeyFromJSONField("command_id"), dedupe.JSONFingerprint
	})
	code, rep, errs := lw.verify(t, "--duplicate", "2", "--key", "field:command_id", "--fingerprint", "json")
	if code != replaycli.ExitOK || !rep.Pass || rep.ReApplied != 0 || rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
	if rep.KeyReused != int64(2*lw.wl.KeyReused) || rep.Deduplicated < int64(2*lw.wl.Unique) ||
		rep.Deduplicated+rep.KeyReused+rep.Untracked != rep.Replayed {
		t.Fatalf("report %+v; workload has %d commands and %d key reuses", rep, lw.wl.Unique, lw.wl.KeyReused)
	}
	if code, _, errs := lw.verify(t, "--key", "offset"); code != replaycli.ExitUsage {
		t.Fatalf("--key offset: exit %d\n%s", code, errs)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

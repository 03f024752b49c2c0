package ledger_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

func runCLI(ctx context.Context, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := ledger.Main(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// Help asked for goes to stdout with exit 0; each command lists the flags it
// uses and no other.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		if code, out, errs := runCLI(context.Background(), args...); code != 0 || !strings.Contains(out, "ledger-consumer worker") || errs != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	if code, out, errs := runCLI(context.Background()); code != 2 || out != "" || !strings.Contains(errs, "Usage") {
		t.Errorf("no command: exit %d, stdout %q", code, out)
	}
	flags := map[string][]string{
		"demo":    {"database-url", "brokers", "n", "accounts", "duplicates", "key-reuse", "malformed", "seed", "replay", "no-dedupe", "batch"},
		"migrate": {"database-url", "schema"},
		"worker": {"database-url", "brokers", "schema", "commands", "events", "dead-letter", "group", "metrics-addr", "console", "migrate", "no-dedupe", "batch", "key-layout", "key-cleanup",
			"transport", "group-protocol", "instance-id"},
		"load":   {"brokers", "commands", "n", "accounts", "duplicates", "key-reuse", "malformed", "seed"},
		"verify": {"database-url", "brokers", "schema", "commands"},
	}
	all := map[string]bool{}
	for _, fs := range flags {
		for _, f := range fs {
			all[f] = true
		}
	}
	for cmd, want := range flags {
		code, out, errs := runCLI(context.Background(), cmd, "-h")
		if code != 0 || errs != "" {
			t.Errorf("%s -h: exit %d, stderr %q", cmd, code, errs)
		}
		has := map[string]bool{}
		for _, f := range want {
			has[f] = true
		}
		for f := range all {
			if listed := strings.Contains(out, "  -"+f+" ") || strings.Contains(out, "  -"+f+"\n"); listed != has[f] {
				t.Errorf("%s -h lists -%s: %v, want %v\n%s", cmd, f, listed, has[f], out)
			}
		}
	}
	if _, out, _ := runCLI(context.Background(), "worker", "-h"); !strings.Contains(out, `(default "127.0.0.1:9090")`) {
		t.Errorf("worker serves /metrics beyond localhost by default:\n%s", out)
	}
}

// worker refuses a key layout or a clean-up interval it does not know as a
// usage error, before it reaches for any server.
func TestWorkerKeyFlags(t *testing.T) {
	for _, args := range [][]string{{"--key-layout", "bogus"}, {"--key-layout", ""}, {"--key-layout", "Partitioned"},
		{"--key-cleanup", "0s"}, {"--key-cleanup", "-1s"}, {"--key-cleanup", "soon"}, {"--key-cleanup", "Off"}} {
		code, out, errs := runCLI(context.Background(), append([]string{"worker", "--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x"}, args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, strings.TrimLeft(args[0], "-")) {
			t.Errorf("worker %v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	_, out, _ := runCLI(context.Background(), "worker", "-h")
	for _, want := range []string{"-key-layout string", `(default "partitioned")`, "-key-cleanup string", `(default "1m")`} {
		if !strings.Contains(out, want) {
			t.Errorf("worker -h lacks %q:\n%s", want, out)
		}
	}
}

// worker refuses a transport it does not know, and franz-go's settings
// without franz-go, as usage errors, before it reaches for any server.
func TestWorkerTransportFlags(t *testing.T) {
	for _, args := range [][]string{{"--transport", "sarama"}, {"--transport", ""}, {"--group-protocol", "consumer"},
		{"--instance-id", "pod-1"}, {"--transport", "franz-go", "--group-protocol", "eager"},
		{"--transport", "franz-go", "--group-protocol", "consumer", "--instance-id", "pod-1"}} {
		code, out, errs := runCLI(context.Background(), append([]string{"worker", "--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/x"}, args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, "--"+strings.TrimLeft(args[len(args)-2], "-")) {
			t.Errorf("worker %v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// The worker on franz-go (--transport franz-go, a static member):
// everything consumed and committed, the balances recomputed from the
// topic match, and the events the relay published through franz-go's
// producer are one per command applied.
func TestWorkerOnFranzGo(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	commands, events, group := kafkatest.Topic(t, 3), kafkatest.Topic(t, 1), kafkatest.Name("g")
	if code, out, errs := runCLI(ctx, "load", "--brokers", brokers[0], "--commands", commands, "--n", "300", "--accounts", "10", "--seed", "7"); code != 0 {
		t.Fatalf("load: exit %d\n%s%s", code, out, errs)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var werr bytes.Buffer
	go func() {
		done <- ledger.Main(wctx, []string{"worker", "--migrate", "--database-url", url, "--brokers", brokers[0], "--schema", db.Schema,
			"--commands", commands, "--events", events, "--dead-letter", kafkatest.Topic(t, 1), "--group", group,
			"--metrics-addr", "", "--transport", "franz-go", "--instance-id", "ledger-0"}, &bytes.Buffer{}, &werr)
	}()
	end := kafkatest.EndOffsets(t, commands, 3)
	testenv.WaitFor(t, 2*time.Minute, "the worker to consume everything and publish its events", func() bool {
		select {
		case code := <-done:
			t.Fatalf("the worker exited %d:\n%s", code, werr.String())
		default:
		}
		got := kafkatest.CommittedOffsets(t, group, commands, 3)
		if got[0] != end[0] || got[1] != end[1] || got[2] != end[2] {
			return false
		}
		var pending int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_outbox")+" WHERE status = 'PENDING'").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	// The group's one member is the static member the worker joined as.
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	groups, err := kadm.NewClient(adm).DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if g := groups[group]; g.Err != nil || len(g.Members) != 1 || g.Members[0].InstanceID == nil || *g.Members[0].InstanceID != "ledger-0" {
		t.Fatalf("the group's members: %+v, want the static member ledger-0", g)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("the worker exited %d:\n%s", code, werr.String())
	}
	var published int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_outbox")+" WHERE status = 'PUBLISHED'").Scan(&published); err != nil {
		t.Fatal(err)
	}
	recs := kafkatest.ReadAll(t, events, 1, 10*time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Key)+"/"+string(r.Value)] = true
	}
	if published == 0 || len(recs) != published || len(seen) != published {
		t.Fatalf("%d events published by the relay, %d records on the events topic, %d distinct", published, len(recs), len(seen))
	}
	code, out, errs := runCLI(ctx, "verify", "--database-url", url, "--brokers", brokers[0], "--schema", db.Schema, "--commands", commands)
	if code != 0 || !strings.Contains(out, "balances match: true") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errs)
	}
}

// load refuses counts and shares out of range as usage errors, and takes 0
// to mean none.
func TestLoadFlags(t *testing.T) {
	for _, args := range [][]string{{"--n", "-5"}, {"--n", "0"}, {"--accounts", "0"}, {"--duplicates", "1.5"},
		{"--key-reuse", "-0.1"}, {"--malformed", "NaN"}} {
		code, out, errs := runCLI(context.Background(), append([]string{"load", "--brokers", "127.0.0.1:1"}, args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, "--"+strings.TrimLeft(args[0], "-")) {
			t.Errorf("load %v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	// An unreachable broker is named.
	if code, _, errs := runCLI(context.Background(), "load", "--brokers", "127.0.0.1:1", "--n", "5"); code != 1 || !strings.Contains(errs, "127.0.0.1:1") {
		t.Errorf("unreachable broker: exit %d, stderr %q", code, errs)
	}
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	code, out, errs := runCLI(context.Background(), "load", "--brokers", brokers[0], "--commands", topic,
		"--n", "30", "--duplicates", "0", "--key-reuse", "0", "--malformed", "0")
	want := "produced 30 records: 30 commands, 0 duplicates, 0 key reuses, 0 malformed\n"
	if code != 0 || out != want {
		t.Fatalf("exit %d, stdout %q, want %q\n%s", code, out, want, errs)
	}
	if end := kafkatest.EndOffsets(t, topic, 2); end[0]+end[1] != 30 {
		t.Fatalf("%d records on the topic, want 30", end[0]+end[1])
	}
}

// A production deployment: `migrate` runs as the schema's owner (and
// creates the first key partitions); the worker runs as a role that may
// only read and write the rows (no DDL), with the key clean-up left to a
// process of the owner (--key-cleanup off), and consumes.
func TestWorkerRunsWithoutDDLRights(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	if code, out, errs := runCLI(ctx, "migrate", "--database-url", url, "--schema", db.Schema); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "ledger_worker_" + hex.EncodeToString(b)
	r, s := pgx.Identifier{role}.Sanitize(), pgx.Identifier{db.Schema}.Sanitize()
	for _, q := range []string{
		"CREATE ROLE " + r + " LOGIN PASSWORD 'w0rker'",
		"GRANT USAGE ON SCHEMA " + s + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + s + " TO " + r,
		"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA " + s + " TO " + r,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+r)
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+r)
	})
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.UserPassword(role, "w0rker")
	commands, group := kafkatest.Topic(t, 3), kafkatest.Name("g")
	if code, out, errs := runCLI(ctx, "load", "--brokers", brokers[0], "--commands", commands, "--n", "200", "--accounts", "10", "--seed", "5"); code != 0 {
		t.Fatalf("load: exit %d\n%s%s", code, out, errs)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var werr bytes.Buffer
	go func() {
		done <- ledger.Main(wctx, []string{"worker", "--database-url", u.String(), "--brokers", brokers[0], "--schema", db.Schema,
			"--commands", commands, "--events", kafkatest.Topic(t, 1), "--dead-letter", kafkatest.Topic(t, 1), "--group", group,
			"--metrics-addr", "", "--key-cleanup", "off"}, &bytes.Buffer{}, &werr)
	}()
	end := kafkatest.EndOffsets(t, commands, 3)
	testenv.WaitFor(t, 2*time.Minute, "the worker to consume everything", func() bool {
		select {
		case code := <-done:
			t.Fatalf("the worker exited %d:\n%s", code, werr.String())
		default:
		}
		got := kafkatest.CommittedOffsets(t, group, commands, 3)
		return got[0] == end[0] && got[1] == end[1] && got[2] == end[2]
	})
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("the worker exited %d:\n%s", code, werr.String())
	}
	code, out, errs := runCLI(ctx, "verify", "--database-url", u.String(), "--brokers", brokers[0], "--schema", db.Schema, "--commands", commands)
	if code != 0 || !strings.Contains(out, "balances match: true") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errs)
	}
}

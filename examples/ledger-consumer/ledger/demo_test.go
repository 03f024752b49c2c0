package ledger_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

func demo(t *testing.T, noDedupe bool) ledger.Summary { return demoWith(t, noDedupe, 0, "") }

// demoWith runs the demo; apiAddr "off" produces the workload to Kafka
// directly, "" posts its commands to the HTTP API.
func demoWith(t *testing.T, noDedupe bool, batch int, apiAddr string) ledger.Summary {
	t.Helper()
	sum, _ := demoIn(t, noDedupe, batch, apiAddr)
	return sum
}

// demoIn is demoWith that also returns the demo's database and schema.
func demoIn(t *testing.T, noDedupe bool, batch int, apiAddr string) (ledger.Summary, *pgtest.DB) {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	url := pgtest.RequireURL(t)
	db := pgtest.NewEmpty(t) // its schema dropped and re-created by the demo, dropped again at the end
	load := ledger.DefaultLoad()
	load.Commands, load.Accounts, load.Seed = 1500, 40, 42
	sum, err := ledger.Demo(context.Background(), ledger.DemoConfig{
		DatabaseURL: url, Schema: db.Schema, Brokers: brokers, NoDedupe: noDedupe, Replay: !noDedupe && batch == 0, Load: load, Batch: batch,
		APIAddr: apiAddr,
	})
	if err != nil {
		t.Fatal(err)
	}
	return sum, db
}

// The demo's workload on the resolved broker (the real one in CI): every
// command applied once, every duplicate skipped, every bad record
// dead-lettered, and the balances equal those recomputed from the topic.
//
// The commands went through the HTTP API, each with its Idempotency-Key,
// some sent twice on purpose: one key and one command on the topic per
// distinct request, and the balances are those of each command applied once.
func TestDemoWorkload(t *testing.T) {
	t.Parallel()
	sum, db := demoIn(t, false, 0, "")
	w := sum.Workload
	v, c := sum.Verify, sum.Worker
	if !sum.Match() {
		t.Fatalf("balances differ: %v", v.Mismatches)
	}
	if v.Unique != w.Unique || v.Duplicates != w.Duplicates || v.KeyReused != w.KeyReused || v.Malformed != w.Malformed {
		t.Fatalf("verify counted %+v, generated %+v", v, w)
	}
	if c.Applied != int64(w.Unique) || c.KeyReused != int64(w.KeyReused) ||
		c.DeadLettered != int64(w.KeyReused+w.Malformed) || c.Duplicates < int64(w.Duplicates) {
		t.Fatalf("worker counted %+v; workload %+v", c, w)
	}
	if r := sum.Replayed; r.Applied != 0 || r.Duplicates != int64(w.Unique+w.Duplicates) || sum.ReplayElapsed == 0 {
		t.Fatalf("replay of the topic: %+v, want every valid record a duplicate", r)
	}
	if c.Rejected == 0 {
		t.Fatal("no command broke a rule: the workload does not exercise rejections")
	}
	h := sum.HTTP
	if h.Accepted != w.Unique || h.Duplicates == 0 || h.Replayed < h.Duplicates || h.Requests != int64(h.Accepted)+h.Duplicates+h.Retried {
		t.Fatalf("HTTP: %+v; workload %d commands", h, w.Unique)
	}
	// One command per accepted request on the topic (a copy written by a
	// retried publish is byte-identical), and one key per request.
	if o := h.Commands; o.Distinct != w.Unique || o.Records < w.Unique || o.Conflicting != 0 {
		t.Fatalf("commands the outbox published: %+v, want %d distinct", o, w.Unique)
	}
	var keys int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+db.Keys()+" WHERE scope = $1",
		ledger.APIScope).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != w.Unique {
		t.Fatalf("%d keys of the API, want %d", keys, w.Unique)
	}
	var out strings.Builder
	sum.Print(&out)
	if !strings.Contains(out.String(), "HTTP requests") {
		t.Fatalf("the summary does not report the HTTP requests:\n%s", out.String())
	}
	// One event per command through both runs: a replayed duplicate emits
	// nothing new, and a copy written by a retried publish is byte-identical.
	if e := sum.Events; e.Distinct != w.Unique || e.Records < w.Unique || e.Conflicting != 0 {
		t.Fatalf("events topic: %+v, want %d distinct events, copies identical", e, w.Unique)
	}
	// Every key reuse and malformed record on the dead-letter topic once per
	// pass (the replay dead-letters them again), each with its reason.
	if d, want := sum.DeadLetters, 2*(w.KeyReused+w.Malformed); d.Records != want || d.WithReason != want {
		t.Fatalf("dead-letter topic: %+v, want %d records (2 passes), each with a reason", d, want)
	}
	// On a real broker the demo leaves no topic behind.
	if b, _ := kafkatest.Resolve(); b.Kind != kafkatest.KindInProcess {
		testenv.WaitFor(t, time.Minute, "the demo's topics to be deleted", func() bool {
			md, err := kafkatest.Client(t).Metadata(context.Background(), &kafka.MetadataRequest{Topics: sum.Topics})
			if err != nil {
				return false
			}
			for _, tp := range md.Topics {
				if tp.Error == nil {
					return false
				}
			}
			return len(sum.Topics) == 3
		})
	}
}

// The demo's workload consumed in batch mode too, into a schema of its
// own: the same balances, each command applied once, every bad record
// dead-lettered with its reason, one event per command. The workload goes
// to Kafka directly here (--api-addr off).
func TestDemoBatchMode(t *testing.T) {
	t.Parallel()
	sum := demoWith(t, false, 200, "off")
	if sum.HTTP.Addr != "" || sum.HTTP.Requests != 0 {
		t.Fatalf("--api-addr off sent HTTP requests: %+v", sum.HTTP)
	}
	w, c, v := sum.Workload, sum.Batched, sum.BatchVerify
	if !sum.Match() || !v.Match() || sum.BatchElapsed == 0 {
		t.Fatalf("balances differ: per-message %v, batch %v", sum.Verify.Mismatches, v.Mismatches)
	}
	if c.Applied != int64(w.Unique) || c.KeyReused != int64(w.KeyReused) ||
		c.DeadLettered != int64(w.KeyReused+w.Malformed) || c.Duplicates < int64(w.Duplicates) || c.Rejected == 0 {
		t.Fatalf("batch mode counted %+v; workload %+v", c, w)
	}
	if e := sum.BatchEvents; e.Distinct != w.Unique || e.Conflicting != 0 {
		t.Fatalf("batch mode's events topic: %+v, want %d distinct events", e, w.Unique)
	}
	if d, want := sum.BatchDeadLetters, w.KeyReused+w.Malformed; d.Records != want || d.WithReason != want {
		t.Fatalf("batch mode's dead-letter topic: %+v, want %d records, each with a reason", d, want)
	}
	var out strings.Builder
	sum.Print(&out)
	if !strings.Contains(out.String(), "batch mode (200)") || !strings.Contains(out.String(), "per-message mode") {
		t.Fatalf("the summary does not report both modes:\n%s", out.String())
	}
}

// Without the dedupe middleware the same workload applies duplicates again,
// and verify catches it.
func TestDemoWithoutDedupeFailsVerify(t *testing.T) {
	t.Parallel()
	if sum := demo(t, true); sum.Match() {
		t.Fatal("verify passed for a consumer that applies duplicates")
	}
}

// The worker serves /healthz while it runs, /metrics fed by the hooks, and
// the operator console beside them (read-only: no token).
func TestWorkerServesMetricsAndHealth(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	k := newKit(t, 2, ledger.Config{MetricsAddr: addr, Console: &console.Config{}})
	wl, err := ledger.Generate(ledger.LoadConfig{Commands: 60, Accounts: 5, Duplicates: 0.1, KeyReuse: 0.02, Malformed: 0.02, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Produce(context.Background(), k.Brokers(), k.Topic(), wl.Records); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.WaitFor(t, time.Minute, "/healthz to answer 200", func() bool { code, _ := get("/healthz"); return code == 200 })
	k.WaitCaughtUp()
	code, body := get("/metrics")
	// plugin/eprom's metrics, which the dashboard in docs/ shows, and the
	// ledger's own.
	want := []string{fmt.Sprintf(`exactly_messages_total{outcome="applied",scope="%s",topic="%s"} %d`, ledger.Scope, k.Topic(), wl.Unique),
		"exactly_message_duration_seconds_bucket", "exactly_dead_lettered_total", "exactly_outbox_published_total",
		`exactly_keys{status="completed"}`, "exactly_keys_table_bytes", "exactly_outbox_pending", "ledger_rejected_total"}
	for _, w := range want {
		if code != 200 || !strings.Contains(body, w) {
			t.Fatalf("/metrics %d, want %q among:\n%s", code, w, body)
		}
	}
	if code, page := get("/console/"); code != 200 || !strings.Contains(page, "<td>"+k.Topic()+"</td>") || !strings.Contains(page, "read-only") {
		t.Fatalf("/console/ %d, want the page, read-only, with the partitions of %s:\n%s", code, k.Topic(), page)
	}
	// Every exactly_ metric it serves is on the dashboard in docs/.
	dash, err := os.ReadFile("../../../docs/grafana/exactly.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		if !strings.HasPrefix(name, "exactly_") {
			continue
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(body, "# TYPE "+base+" histogram") {
				name = base
			}
		}
		if !strings.Contains(string(dash), name) {
			t.Errorf("/metrics serves %s, which the dashboard does not show", name)
		}
	}
}

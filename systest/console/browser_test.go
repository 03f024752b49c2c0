package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// browser starts a headless chromium with a profile of its own and
// returns its context.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no chromium at %s (apt-get install -y chromium, or set CHROMIUM): %v", path, err)
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000)}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancelTimeout)
	return ctx
}

// text is the visible text of the first element sel finds.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// A worker dead-letters a command of an account it does not know. The
// console, served beside the worker's /healthz, shows the letter with its
// reason in chromium; the account is added, and a click on the letter's
// redrive (with the token typed into its form) gets the command applied,
// once: a second redrive of the same letter publishes nothing, and the key
// lookup finds the command applied from the commands topic.
func TestConsoleInBrowser(t *testing.T) {
	if os.Getenv("EXACTLY_BROWSER_TEST") != "1" {
		t.Skip("the console's browser test runs with EXACTLY_BROWSER_TEST=1 and chromium (make test-console)")
	}
	kafkatest.RequireReal(t)
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	commands, dlq := kafkatest.Topic(t, 2), kafkatest.Topic(t, 1)
	group := kafkatest.Name("console")
	ctx := context.Background()
	applied, accounts := db.Table("applied"), db.Table("accounts")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (id text PRIMARY KEY, account text NOT NULL, n int NOT NULL);"+
		"CREATE TABLE "+accounts+" (id text PRIMARY KEY); INSERT INTO "+accounts+" VALUES ('acct-1')"); err != nil {
		t.Fatal(err)
	}
	// The poison: a command of an account not in accounts is refused for
	// good, until the test adds the account.
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		var cmd struct{ Account string }
		if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
			return nil, dedupe.Permanent(err)
		}
		var known bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+accounts+" WHERE id = $1)", cmd.Account).Scan(&known); err != nil {
			return nil, err
		}
		if !known {
			return nil, dedupe.Permanent(fmt.Errorf("unknown account %s", cmd.Account))
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, $2, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID, cmd.Account)
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wk, err := worker.New(db.Pool, &worker.Config{Scope: "payments", Schema: db.Schema, Brokers: brokers, Topic: commands,
		DeadLetterTopic: dlq, Group: group, Handler: handler, Tables: []string{"applied", "accounts"}, Logger: log,
		StartupBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const token = "console-test-token"
	con, err := wk.Console(&console.Config{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", wk.HealthHandler())
	mux.Handle("/console/", http.StripPrefix("/console", con))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wk.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	<-wk.Running()

	const poisonID = "0190a0e8-0000-7000-8000-000000000009"
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: commands, Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(ctx,
		kafka.Message{Key: []byte("acct-1"), Value: []byte(`{"account":"acct-1"}`), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte("0190a0e8-0000-7000-8000-000000000001")}}},
		kafka.Message{Key: []byte("acct-9"), Value: []byte(`{"account":"acct-9"}`), Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(poisonID)}}},
	); err != nil {
		t.Fatal(err)
	}
	caughtUp := func() {
		t.Helper()
		end := kafkatest.EndOffsets(t, commands, 2)
		testenv.WaitFor(t, time.Minute, "the worker at the end of "+commands, func() bool {
			committed := kafkatest.CommittedOffsets(t, group, commands, 2)
			for p, o := range end {
				if o > 0 && committed[p] != o {
					return false
				}
			}
			return true
		})
	}
	caughtUp()
	testenv.WaitFor(t, time.Minute, "the dead letter", func() bool { return kafkatest.EndOffsets(t, dlq, 1)[0] == 1 })
	count := func() (rows, n int) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(n), 0) FROM "+applied+" WHERE id = $1", poisonID).Scan(&rows, &n); err != nil {
			t.Fatal(err)
		}
		return rows, n
	}
	if rows, _ := count(); rows != 0 {
		t.Fatalf("the poison command was applied before its account existed")
	}

	// The page, in chromium: the letter and its reason.
	bctx := browser(t)
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/console/"), chromedp.WaitVisible(`#letters`)); err != nil {
		t.Fatal(err)
	}
	reason, health, partitions := text(t, bctx, `tr.letter td.reason`), text(t, bctx, `#health`), text(t, bctx, `#partitions`)
	if reason != "unknown account acct-9" {
		t.Fatalf("the letter's reason on the page is %q", reason)
	}
	if strings.TrimSpace(health) != "ok" || !strings.Contains(partitions, commands) {
		t.Fatalf("health %q, partitions %q", health, partitions)
	}
	if path := os.Getenv("EXACTLY_CONSOLE_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The account exists now: the letter's redrive, with the token.
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+accounts+" VALUES ('acct-9')"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(`tr.letter input[name="token"]`, token),
		chromedp.Click(`tr.letter button[name="redrive"]`),
		chromedp.WaitVisible(`#note`),
	); err != nil {
		t.Fatal(err)
	}
	note := text(t, bctx, `#note`)
	if !strings.Contains(note, "redriven to "+commands) {
		t.Fatalf("after the click the page says %q", note)
	}
	caughtUp()
	if rows, n := count(); rows != 1 || n != 1 {
		t.Fatalf("after the redrive the command is applied %d times (%d rows), want once", n, rows)
	}

	// The same letter again, from the form by offset: not published again.
	if err := chromedp.Do(bctx,
		chromedp.SetValue(`#redrive-at input[name="partition"]`, "0"),
		chromedp.SetValue(`#redrive-at input[name="offset"]`, "0"),
		chromedp.SendKeys(`#redrive-at input[name="token"]`, token),
		chromedp.Submit(`#redrive-at`),
		chromedp.WaitVisible(`#note`),
	); err != nil {
		t.Fatal(err)
	}
	note = text(t, bctx, `#note`)
	if !strings.Contains(note, "already redriven") {
		t.Fatalf("the second redrive says %q", note)
	}
	var redrives int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_redrives")+" WHERE dlq_topic = $1 AND message_id = $2", dlq, poisonID).Scan(&redrives); err != nil || redrives != 1 {
		t.Fatalf("exactly_redrives holds %d rows for the letter (%v), want 1", redrives, err)
	}
	caughtUp()
	if rows, n := count(); rows != 1 || n != 1 {
		t.Fatalf("after a second redrive the command is applied %d times (%d rows), want once", n, rows)
	}

	// The key lookup: applied, from the commands topic.
	if err := chromedp.Do(bctx,
		chromedp.SetValue(`#lookup input[name="key"]`, poisonID),
		chromedp.Submit(`#lookup`),
		chromedp.WaitVisible(`#lookup-result`),
	); err != nil {
		t.Fatal(err)
	}
	found := text(t, bctx, `#lookup-result`)
	if !strings.Contains(found, "yes") || !strings.Contains(found, commands+" partition") {
		t.Fatalf("the key lookup says %q", found)
	}
}

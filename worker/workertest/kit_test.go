package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/worker"
	"github.com/exactly-go/exactly/worker/workertest"
)

// recorder is a testing.TB that records what the kit reports instead of
// failing the test; Fatalf ends the calling goroutine, as testing's does.
// Everything else (Cleanup, Logf, TempDir) goes to the real test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	fatal  string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// take returns what was recorded since the last call, and forgets it.
func (r *recorder) take() (errs []string, fatal string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs, fatal = r.errors, r.fatal
	r.errors, r.fatal = nil, ""
	return errs, fatal
}

// call runs f as a test's goroutine would, so that a Fatalf ends f only.
func call(f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
}

// expect runs f on r and fails t unless what r recorded contains each of
// want (none recorded when want is empty).
func expect(t *testing.T, r *recorder, what string, want []string, f func()) {
	t.Helper()
	call(f)
	errs, fatal := r.take()
	got := strings.Join(append(errs, fatal), "\n")
	if len(want) == 0 && got != "" {
		t.Errorf("%s reported, want nothing:\n%s", what, got)
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s reported\n%s\nwant it to say %q", what, got, w)
		}
	}
}

// tables are the tables of journaled.
var tables = []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)", "CREATE TABLE journal (id text NOT NULL)"}

// journaled is topUp that also records each application in the journal,
// in its transaction.
func journaled(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	out, err := topUp(ctx, tx, msg)
	if err == nil {
		_, err = tx.Exec(ctx, "INSERT INTO journal VALUES ($1)", msg.UUID)
	}
	return out, err
}

// A handler that writes outside its transaction applies a command again
// each time the transaction is retried: AssertAppliedOnce catches it on the
// rows written outside (the journal) and passes on those written inside.
func TestAppliedOnceFailsOnAHandlerThatAppliesTwice(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	k := workertest.New(r, &workertest.Config{Setup: []string{
		"CREATE TABLE journal (id text NOT NULL)", "CREATE TABLE applied (id text NOT NULL)"}})
	var mu sync.Mutex
	failed := map[string]bool{}
	k.Start(&worker.Config{Scope: "twice", Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		if _, err := k.Pool().Exec(ctx, "INSERT INTO journal VALUES ($1)", msg.UUID); err != nil { // the bug: not tx
			return nil, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO applied VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if !failed[msg.UUID] { // the first attempt fails after its writes, as a lost connection would
			failed[msg.UUID] = true
			return nil, errors.New("connection reset")
		}
		return nil, nil
	}})
	k.Send(workertest.Command{ID: "cmd-1", Payload: "1"}, workertest.Command{ID: "cmd-2", Payload: "2"})
	if errs, fatal := r.take(); len(errs) > 0 || fatal != "" {
		t.Fatalf("the kit's set-up failed: %q %s", errs, fatal)
	}
	expect(t, r, "AssertAppliedOnce on the rows written outside the transaction",
		[]string{"command cmd-1 applied 2 times, want 1", "command cmd-2 applied 2 times, want 1"},
		func() { k.AssertAppliedOnce("SELECT id FROM journal") })
	expect(t, r, "AssertAppliedOnce on the rows written in the transaction", nil,
		func() { k.AssertAppliedOnce("SELECT id FROM applied") })
	expect(t, r, "AssertRows on the journal", []string{"cmd-1\n  cmd-1"},
		func() { k.AssertRows("SELECT id FROM journal ORDER BY id", "cmd-1", "cmd-2") })
}

// Each assertion reports what differs, and nothing when nothing does.
func TestAssertionsReportDifferences(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	k := workertest.New(r, &workertest.Config{Partitions: 2, Setup: tables})
	expect(t, r, "Start with a topic of its own", []string{`worker.Config.Topic is "elsewhere"`},
		func() { k.Start(&worker.Config{Scope: "top-ups", Topic: "elsewhere", Handler: topUp}) })
	expect(t, r, "WaitCaughtUp before a worker runs, nothing sent", nil, k.WaitCaughtUp)
	k.Start(&worker.Config{Scope: "top-ups", Handler: journaled})
	a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
	reused := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":99}`}
	k.Send(a, reused, workertest.Command{Payload: `{"account":"acc-2","amount":1}`}) // the last without an ID
	expect(t, r, "the right assertions", nil, func() {
		k.AssertRows("SELECT id, balance FROM accounts", "acc-1 10")
		k.AssertAppliedOnce("SELECT id FROM journal")
		k.AssertOutputs("topped-up-cmd-1")
		k.AssertDeadLetters("cmd-1", "")
	})
	if dl := k.DeadLetters(); len(dl) != 2 || dl[0].Reason == "" || dl[1].Reason == "" {
		t.Errorf("dead letters %+v, want two with a reason", dl)
	}
	expect(t, r, "AssertRows, a balance off", []string{"got rows:\n  acc-1 10\nwant:\n  acc-1 20"},
		func() { k.AssertRows("SELECT id, balance FROM accounts", "acc-1 20") })
	expect(t, r, "AssertRows, a bad query", []string{"AssertRows:", "nowhere"},
		func() { k.AssertRows("SELECT * FROM nowhere") })
	expect(t, r, "AssertAppliedOnce, an applied command excepted", []string{"command cmd-1 applied 1 times, want 0"},
		func() { k.AssertAppliedOnce("SELECT id FROM journal", "cmd-1") })
	expect(t, r, "AssertAppliedOnce, rows of commands never sent", []string{`"acc-1" applied 1 times but never sent`, "command cmd-1 applied 0 times"},
		func() { k.AssertAppliedOnce("SELECT id FROM accounts") })
	expect(t, r, "AssertOutputs, one missing", []string{`holds IDs ["topped-up-cmd-1"], want ["topped-up-cmd-1" "topped-up-cmd-2"]`},
		func() { k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2") })
	expect(t, r, "AssertOutputs, none wanted", []string{`holds IDs ["topped-up-cmd-1"], want []`, `"{\"account\":\"acc-1\",\"balance\":10}"`},
		func() { k.AssertOutputs() })
	if _, err := k.Pool().Exec(context.Background(), "INSERT INTO exactly_outbox (topic, uuid, payload, lane, status) VALUES ($1, 'lost-1', 'x', 0, 'DEAD')", k.OutputTopic()); err != nil {
		t.Fatal(err)
	}
	expect(t, r, "AssertOutputs, one output DEAD in the outbox", []string{`1 output(s) DEAD in the outbox, never published: ["lost-1"]`},
		func() { k.AssertOutputs("topped-up-cmd-1") })
	expect(t, r, "AssertDeadLetters, one copy", []string{"the dead-letter topic holds IDs", "reason="},
		func() { k.AssertDeadLetters("cmd-1") })
}

// WaitCaughtUp fails, saying where the partitions stand, when the worker
// cannot apply a command; and at once when the worker stopped.
func TestWaitCaughtUpFails(t *testing.T) {
	t.Parallel()
	t.Run("stuck", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		k := workertest.New(r, &workertest.Config{Partitions: 1, Timeout: 3 * time.Second})
		k.Start(&worker.Config{Scope: "stuck", DrainTimeout: time.Second,
			Handler: func(context.Context, pgx.Tx, *message.Message) ([]*message.Message, error) {
				return nil, errors.New("the database is down")
			}})
		k.Send(workertest.Command{ID: "cmd-1", Payload: "x"})
		expect(t, r, "WaitCaughtUp", []string{"did not catch up within 3s", "partition 0: end 1, committed -1"}, k.WaitCaughtUp)
		expect(t, r, "AssertOutputs", []string{"did not catch up"}, func() { k.AssertOutputs() })
	})
	t.Run("stopped", func(t *testing.T) {
		t.Parallel()
		r := &recorder{TB: t}
		k := workertest.New(r, &workertest.Config{Partitions: 1})
		k.Run(func(context.Context, string) error { return errors.New("no such table: accounts") })
		k.Send(workertest.Command{ID: "cmd-1", Payload: "x"})
		expect(t, r, "WaitCaughtUp", []string{"the worker stopped before it caught up: no such table: accounts"}, k.WaitCaughtUp)
		expect(t, r, "Stop", nil, func() {
			if err := k.Stop(); err == nil || !strings.Contains(err.Error(), "no such table") {
				t.Errorf("Stop returned %v, want the worker's error", err)
			}
		})
		expect(t, r, "WaitCaughtUp once stopped", []string{"no worker runs", "partition 0: end 1, committed -1"}, k.WaitCaughtUp)
	})
}

// Restart goes on in the same group: nothing is applied or dead-lettered
// again. Replay consumes the whole topic again in a new group: the
// applied commands are duplicates, the refused one is dead-lettered again.
func TestRestartAndReplay(t *testing.T) {
	t.Parallel()
	k := workertest.New(t, &workertest.Config{Setup: tables})
	k.Start(&worker.Config{Scope: "top-ups", Handler: journaled})
	k.Send(workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}, workertest.Command{ID: "bad", Payload: "{"})
	k.WaitCaughtUp()
	first := k.Group()
	k.Restart()
	if k.Group() != first {
		t.Errorf("Restart moved to group %s, want %s", k.Group(), first)
	}
	k.Send(workertest.Command{ID: "cmd-2", Payload: `{"account":"acc-1","amount":1}`})
	k.AssertDeadLetters("bad")
	k.Replay()
	if k.Group() == first {
		t.Errorf("Replay stayed in group %s", first)
	}
	k.Redeliver("cmd-1")
	k.AssertDeadLetters("bad", "bad")
	k.AssertRows("SELECT id, balance FROM accounts", "acc-1 11")
	k.AssertOutputs("topped-up-cmd-1", "topped-up-cmd-2")
	k.Redeliver()
	if got := len(k.Sent()); got != 8 {
		t.Errorf("%d commands sent, want 8 (three, one again, then all four again)", got)
	}
	k.AssertAppliedOnce("SELECT id FROM journal", "bad")
}

// The kit runs on a throwaway PostgreSQL and an in-process broker when the
// environment names no servers.
func TestEmbeddedServers(t *testing.T) {
	env, envDB := os.Getenv(workertest.BrokersEnv), os.Getenv(workertest.DatabaseURLEnv)
	t.Setenv(workertest.DatabaseURLEnv, "")
	t.Setenv(workertest.BrokersEnv, "")
	k := workertest.New(t, &workertest.Config{Setup: []string{"CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)"}})
	if env != "" && strings.Join(k.Brokers(), ",") == env {
		t.Fatalf("brokers %v: the environment's, want the in-process broker", k.Brokers())
	}
	if envDB != "" && strings.HasPrefix(k.DatabaseURL(), strings.Split(envDB, "?")[0]) {
		t.Fatalf("database %s: the environment's", k.DatabaseURL())
	}
	k.Start(&worker.Config{Scope: "top-ups", Handler: topUp})
	a := workertest.Command{ID: "cmd-1", Payload: `{"account":"acc-1","amount":10}`}
	k.Send(a, a)
	k.AssertRows("SELECT id, balance FROM accounts", "acc-1 10")
	k.AssertOutputs("topped-up-cmd-1")
}

// A user's end-to-end test of a worker fits in under 40 lines: the
// example's test function, which runs as a test of its own, and which the
// package doc and docs/testing.md show as it is.
func TestExampleIsShort(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var fn *ast.FuncDecl
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "TestTopUps" {
			fn = d
		}
	}
	if fn == nil {
		t.Fatal("example_test.go has no TestTopUps")
	}
	lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
	t.Logf("TestTopUps: %d lines", lines)
	if lines >= 40 {
		t.Errorf("TestTopUps is %d lines, want under 40", lines)
	}
	body := string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "//\t"+strings.ReplaceAll(body, "\n", "\n//\t")) {
		t.Errorf("the package doc does not show TestTopUps as example_test.go has it: copy it")
	}
	page, err := os.ReadFile("../../docs/testing.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "```go\n"+body+"\n```") {
		t.Errorf("docs/testing.md does not show TestTopUps as example_test.go has it: copy it")
	}
	if want := fmt.Sprintf("%d lines", lines); !strings.Contains(string(page), want) {
		t.Errorf("docs/testing.md does not say TestTopUps is %s", want)
	}
}

// The library's own module requires neither the kit nor embedpg: a program
// that imports the library compiles no throwaway PostgreSQL.
func TestCoreDoesNotRequireTheKit(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(mod), "module github.com/exactly-go/exactly\n") {
		t.Fatalf("../../go.mod is not the library's:\n%.80s", mod)
	}
	for _, m := range []string{"github.com/exactly-go/exactly/worker/workertest ", "github.com/exactly-go/exactly/embedpg "} {
		if strings.Contains(string(mod), m) {
			t.Errorf("the library's go.mod requires %s: its importers would download it", strings.TrimSpace(m))
		}
	}
}

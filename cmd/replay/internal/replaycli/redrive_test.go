package replaycli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/worker"
)

// A worker dead-letters the commands of an account it does not know yet
// (and one malformed command). The account is added; redrive lists the
// letters with their reasons, filters them, and publishes those of the
// unknown account back as they arrived: each is applied once. A second
// redrive publishes nothing; two at once publish each letter once; one
// that publishes again (its records lost) is absorbed by the worker's keys.
func TestRedriveThroughTheWorker(t *testing.T) {
	kafkatest.RequireReal(t)
	t.Parallel()
	db := pgtest.New(t)
	url, _ := pgtest.URL()
	brokers := kafkatest.Brokers(t)
	commands, dlq := kafkatest.Topic(t, 2), kafkatest.Topic(t, 1)
	group := kafkatest.Name("redrive")
	ctx := context.Background()
	applied := db.Table("applied")
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+applied+" (id text PRIMARY KEY, account text NOT NULL, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var known atomic.Bool // the account "acct-9" exists
	handler := func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		var cmd struct{ Account string }
		if err := json.Unmarshal(msg.Payload, &cmd); err != nil || cmd.Account == "" {
			return nil, dedupe.Permanent(fmt.Errorf("malformed command %q", msg.Payload))
		}
		if cmd.Account == "acct-9" && !known.Load() {
			return nil, dedupe.Permanent(errors.New("unknown account acct-9"))
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+applied+" VALUES ($1, $2, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1", msg.UUID, cmd.Account)
		return nil, err
	}
	wk, err := worker.New(db.Pool, &worker.Config{Scope: "payments", Schema: db.Schema, Brokers: brokers, Topic: commands,
		DeadLetterTopic: dlq, Group: group, Handler: handler, Tables: []string{"applied"}, Logger: quiet(), StartupBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
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

	// Eight commands: five of known accounts, two of acct-9, one malformed.
	var sent []kafka.Message
	for i, account := range []string{"acct-1", "acct-9", "acct-2", "", "acct-9", "acct-3", "acct-1", "acct-2"} {
		sent = append(sent, kafka.Message{Key: []byte(fmt.Sprintf("key-%d", i%4)), Value: fmt.Appendf(nil, `{"account":%q}`, account),
			Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: fmt.Appendf(nil, "0190a0e8-0000-7000-8000-%012d", i)},
				{Key: "trace", Value: fmt.Appendf(nil, "t-%d", i)}}})
	}
	kw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: commands, Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer kw.Close()
	if err := kw.WriteMessages(ctx, sent...); err != nil {
		t.Fatal(err)
	}
	caughtUp := func() {
		t.Helper()
		end := kafkatest.EndOffsets(t, commands, 2)
		testenv.WaitFor(t, time.Minute, "the worker at the end of "+commands, func() bool {
			return fmt.Sprint(kafkatest.CommittedOffsets(t, group, commands, 2)) == fmt.Sprint(end)
		})
	}
	caughtUp()
	if n := count(t, db, "SELECT count(*) FROM "+applied); n != 5 {
		t.Fatalf("%d commands applied, want the 5 of known accounts", n)
	}
	letters := func(args ...string) replaycli.RedriveReport {
		t.Helper()
		args = append([]string{"redrive", "--json", "--brokers", brokers[0], "--dlq", dlq, "--database-url", url, "--schema", db.Schema}, args...)
		code, out, errs := run(args...)
		var rep replaycli.RedriveReport
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("%v: exit %d\n%s\n%s", args, code, out, errs)
		}
		return rep
	}
	testenv.WaitFor(t, time.Minute, "three dead letters", func() bool { return letters().Read == 3 })

	// The list: each letter with its source, handler and reason.
	all := letters()
	if len(all.Letters) != 3 || all.Executed {
		t.Fatalf("list: %+v", all)
	}
	for _, l := range all.Letters {
		if l.Source != commands || l.Handler == "" || l.ID == "" || l.Key == "" || l.RedrivenAt != nil || l.Outcome != "" {
			t.Errorf("letter %+v: want its source %s, handler, ID and key, not redriven", l, commands)
		}
	}
	if rep := letters("--reason", "unknown account"); len(rep.Letters) != 2 || rep.Letters[0].Reason != "unknown account acct-9" {
		t.Fatalf("by reason: %+v", rep.Letters)
	}
	if rep := letters("--key", "key-1", "--reason", "unknown account"); len(rep.Letters) != 1 || rep.Letters[0].ID != string(sent[1].Headers[0].Value) {
		t.Fatalf("by key: %+v", rep.Letters)
	}
	if rep := letters("--id", string(sent[3].Headers[0].Value)); len(rep.Letters) != 1 || !strings.Contains(rep.Letters[0].Reason, "malformed") {
		t.Fatalf("by ID: %+v", rep.Letters)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if rep := letters("--from-time", future); len(rep.Letters) != 0 {
		t.Fatalf("from an hour ahead: %+v", rep.Letters)
	}
	if code, _, errs := run("redrive", "--brokers", brokers[0], "--dlq", dlq, "--execute", "--database-url", ""); code != replaycli.ExitUsage {
		t.Fatalf("--execute without a database: exit %d %s", code, errs)
	}

	// The account exists now: redrive its letters, once.
	known.Store(true)
	before := kafkatest.EndOffsets(t, commands, 2)
	rep := letters("--reason", "unknown account", "--execute")
	if rep.Redriven != 2 || rep.Skipped != 0 || !rep.Executed {
		t.Fatalf("redrive: %+v", rep)
	}
	caughtUp()
	wantApplied := func() {
		t.Helper()
		if n := count(t, db, "SELECT count(*) FROM "+applied+" WHERE n = 1"); n != 7 {
			t.Fatalf("%d commands applied once, want 7", n)
		}
		if n := count(t, db, "SELECT count(*) FROM "+applied); n != 7 {
			t.Fatalf("%d commands applied, want 7", n)
		}
	}
	wantApplied()
	if n := count(t, db, "SELECT count(*) FROM "+applied+" WHERE account = 'acct-9'"); n != 2 {
		t.Fatalf("%d commands of acct-9 applied, want 2", n)
	}
	// Published as they arrived: key, value and headers, the message ID
	// among them, without the dead-letter headers.
	var redriven []kafka.Message
	for _, m := range kafkatest.ReadAll(t, commands, 2, time.Minute) {
		if m.Offset >= before[m.Partition] {
			redriven = append(redriven, m)
		}
	}
	if len(redriven) != 2 {
		t.Fatalf("%d records redriven into %s, want 2", len(redriven), commands)
	}
	for _, m := range redriven {
		i := slices.IndexFunc(sent, func(s kafka.Message) bool {
			return bytes.Equal(s.Headers[0].Value, headerValue(m, kafkapubsub.UUIDHeader))
		})
		if i != 1 && i != 4 {
			t.Fatalf("redriven record %s: not one of acct-9's commands", m.Value)
		}
		if !bytes.Equal(m.Key, sent[i].Key) || !bytes.Equal(m.Value, sent[i].Value) || fmt.Sprint(headerText(m.Headers)) != fmt.Sprint(headerText(sent[i].Headers)) {
			t.Errorf("redriven %q %q %v; want it as sent: %q %q %v", m.Key, m.Value, headerText(m.Headers), sent[i].Key, sent[i].Value, headerText(sent[i].Headers))
		}
	}

	// Again: nothing published, the letters reported as redriven.
	rep = letters("--reason", "unknown account", "--execute")
	if rep.Redriven != 0 || rep.Skipped != 2 || rep.Letters[0].RedrivenAt == nil {
		t.Fatalf("second redrive: %+v", rep)
	}
	if got := kafkatest.EndOffsets(t, commands, 2); fmt.Sprint(got) == fmt.Sprint(before) || sum(got)-sum(before) != 2 {
		t.Fatalf("end offsets %v after the second redrive, want 2 records past %v", got, before)
	}
	// Its records lost (a commit that did not happen after the publish):
	// published again, absorbed by the worker's keys.
	if _, err := db.Pool.Exec(ctx, "DELETE FROM "+db.Table("exactly_redrives")); err != nil {
		t.Fatal(err)
	}
	// Two redrives at once (both listed before either publishes) publish
	// each letter once between them.
	listed := make(chan struct{}, 2)
	reset := replaycli.SetAfterList(func() {
		listed <- struct{}{}
		testenv.WaitFor(t, time.Minute, "both redrives listed", func() bool { return len(listed) == 2 })
	})
	defer reset()
	reps := make(chan replaycli.RedriveReport, 2)
	for range 2 {
		go func() {
			args := []string{"redrive", "--json", "--brokers", brokers[0], "--dlq", dlq, "--database-url", url, "--schema", db.Schema,
				"--reason", "unknown account", "--execute"}
			code, out, errs := run(args...)
			var rep replaycli.RedriveReport
			if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
				t.Errorf("concurrent redrive: exit %d\n%s\n%s", code, out, errs)
			}
			reps <- rep
		}()
	}
	if a, b := <-reps, <-reps; a.Redriven+b.Redriven != 2 || a.Skipped+b.Skipped != 2 {
		t.Fatalf("redrives at once after the records were lost: %+v and %+v; want 2 redriven between them", a, b)
	}
	reset()
	if got := kafkatest.EndOffsets(t, commands, 2); sum(got)-sum(before) != 4 {
		t.Fatalf("end offsets %v, want 4 records past %v", got, before)
	}
	caughtUp()
	wantApplied()
}

func count(t *testing.T, db *pgtest.DB, sql string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func sum(m map[int]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

func headerValue(m kafka.Message, key string) []byte {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

func headerText(hs []kafka.Header) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		if h.Key == middleware.ReasonForPoisonedKey {
			out = append(out, "REASON")
			continue
		}
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

package ledgertest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/exactly-go/exactly/cmd/replay/internal/replaycli"
	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// Commands that entered through the ledger's HTTP API, each request sent
// twice (a client's retry), reach the topic once each through the outbox
// (UUIDv7 command IDs, keys in the default layout); replaying the topic
// into the worker applies none of them again, and verify finds every
// replayed record's key.
func TestVerifyAfterTheHTTPAPI(t *testing.T) {
	t.Parallel()
	kafkatest.RequireReal(t)
	lw := &ledgerWorld{db: pgtest.NewEmpty(t), brokers: kafkatest.Brokers(t)}
	lw.url, _ = pgtest.URL()
	ctx := context.Background()
	if err := ledger.Migrate(ctx, lw.db.Pool, lw.db.Schema, nil); err != nil {
		t.Fatal(err)
	}
	lw.commands, lw.dlq, lw.group = kafkatest.Topic(t, 3), kafkatest.Topic(t, 1), kafkatest.Name("ledger")
	lw.cfg = ledger.Config{Schema: lw.db.Schema, Brokers: lw.brokers, Commands: lw.commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: lw.dlq, Group: lw.group, Logger: quiet()}
	api, err := ledger.NewAPI(ctx, lw.db.Pool, ledger.APIConfig{Schema: lw.db.Schema, Commands: lw.commands, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	const n = 60
	for i := range n {
		path, body := fmt.Sprintf("/accounts/a-%d/topup", i%6), `{"amount": 100}`
		if i >= n/2 {
			path, body = fmt.Sprintf("/accounts/a-%d/hold", i%6), fmt.Sprintf(`{"amount": 30, "hold_id": "h-%d"}`, i)
		}
		var first string
		for try := range 2 {
			req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", fmt.Sprintf(`"k-%d"`, i))
			req.Header.Set("X-Client", "teller")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			replayed := resp.Header.Get("Idempotent-Replayed") == "true"
			if resp.StatusCode != http.StatusAccepted || replayed != (try == 1) || (try == 1 && string(b) != first) {
				t.Fatalf("request %d, try %d: %d (replayed %v) %s", i, try, resp.StatusCode, replayed, b)
			}
			first = string(b)
		}
	}
	// The worker's relay publishes the API's outbox; the worker applies it.
	lw.start(t)
	t.Cleanup(func() { lw.stop() })
	testenv.WaitFor(t, time.Minute, "the outbox to publish the accepted commands", func() bool {
		var sum int64
		for _, o := range kafkatest.EndOffsets(t, lw.commands, 3) {
			sum += o
		}
		return sum >= n
	})
	if end := kafkatest.EndOffsets(t, lw.commands, 3); end[0]+end[1]+end[2] != n {
		t.Fatalf("%v records on the commands topic, want %d: one per accepted request", end, n)
	}
	lw.waitCaughtUp(t)
	code, rep, errs := lw.verify(t)
	if code != replaycli.ExitOK || !rep.Pass || rep.ReApplied != 0 || rep.StateChanged {
		t.Fatalf("exit %d, report %+v\n%s", code, rep, errs)
	}
	if rep.Replayed != n || rep.Deduplicated != n || rep.Untracked != 0 || rep.KeyReused != 0 {
		t.Fatalf("report %+v: want the %d replayed records each deduplicated against its key", rep, n)
	}
}

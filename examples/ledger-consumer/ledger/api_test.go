package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
)

// apiStep is one request of a client's scenario.
type apiStep struct {
	key, typ, account string
	body              ledger.APIRequest
}

type apiAnswer struct {
	status   int
	body     string
	replayed bool
}

// TestAPIEndToEnd drives the ledger through its HTTP API on real Postgres
// and Kafka: every request is sent by several clients at once and retried
// after its answer; each distinct request becomes one command on the
// topic, applied once to the balances, and every client got the same
// answer for the same key.
func TestAPIEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	k := newKit(t, 3, ledger.Config{Logger: quiet})
	api, err := ledger.NewAPI(ctx, k.Pool(), ledger.APIConfig{Schema: k.Schema(), Commands: k.Topic(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()

	// Each account's scenario runs in order; the accounts run at once.
	const accounts, copies = 6, 4
	scenarios := make([][]apiStep, accounts)
	for a := range scenarios {
		acc, hold := fmt.Sprintf("acc-%d", a), fmt.Sprintf("h-%d", a)
		k := func(i int) string { return fmt.Sprintf("%s-step-%d", acc, i) }
		scenarios[a] = []apiStep{
			{k(0), ledger.Topup, acc, ledger.APIRequest{Amount: 100}},
			{k(1), ledger.Hold, acc, ledger.APIRequest{Amount: 40, HoldID: hold}},
			{k(2), ledger.Capture, acc, ledger.APIRequest{Amount: 30, HoldID: hold}},
			{k(3), ledger.Capture, acc, ledger.APIRequest{Amount: 50, HoldID: hold}}, // over the hold: rejected by the worker
			{k(4), ledger.Release, acc, ledger.APIRequest{Amount: 10, HoldID: hold}},
			{k(5), ledger.Refund, acc, ledger.APIRequest{Amount: 20, HoldID: hold}},
			{k(6), ledger.Topup, acc, ledger.APIRequest{Amount: 5}},
			{k(7), ledger.Topup, acc, ledger.APIRequest{Amount: -5}}, // refused by the API: 400, stored
		}
	}
	// Client "other" reuses acc-0's first key: its own request, its own answer.
	scenarios = append(scenarios, []apiStep{{"acc-0-step-0", ledger.Topup, "acc-other", ledger.APIRequest{Amount: 7}}})
	clientOf := func(a int) string {
		if a == accounts {
			return "other"
		}
		return "c"
	}

	post := func(client string, s apiStep) apiAnswer {
		body, _ := json.Marshal(s.body)
		for {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/accounts/"+s.account+"/"+s.typ, strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", `"`+s.key+`"`)
			req.Header.Set("X-Client", client)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return apiAnswer{}
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusServiceUnavailable {
				time.Sleep(5 * time.Millisecond) // a client's retry
				continue
			}
			return apiAnswer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"}
		}
	}
	var mu sync.Mutex
	answers := map[string][]apiAnswer{} // client/key → every answer
	var wg sync.WaitGroup
	for a, steps := range scenarios {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := clientOf(a)
			for _, s := range steps {
				var cw sync.WaitGroup
				got := make([]apiAnswer, copies+1)
				for i := range copies {
					cw.Add(1)
					go func() { defer cw.Done(); got[i] = post(client, s) }()
				}
				cw.Wait()
				got[copies] = post(client, s) // a retry after the answer
				mu.Lock()
				answers[client+"/"+s.key] = got
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	accepted := map[string]ledger.Command{} // command ID → command
	for key, got := range answers {
		runs := 0
		for _, a := range got {
			if a.status != got[0].status || a.body != got[0].body {
				t.Fatalf("%s: answers differ: %+v", key, got)
			}
			if !a.replayed {
				runs++
			}
		}
		if runs != 1 {
			t.Fatalf("%s: %d answers not replayed, want 1: %+v", key, runs, got)
		}
		switch {
		case strings.HasSuffix(key, "-step-7"):
			if got[0].status != http.StatusBadRequest {
				t.Fatalf("%s: %+v, want 400", key, got[0])
			}
		case got[0].status == http.StatusAccepted:
			var c ledger.Command
			if err := json.Unmarshal([]byte(got[0].body), &c); err != nil {
				t.Fatal(err)
			}
			accepted[c.CommandID] = c
		default:
			t.Fatalf("%s: %+v", key, got[0])
		}
	}
	if want := accounts*7 + 1; len(accepted) != want {
		t.Fatalf("%d commands accepted, want %d", len(accepted), want)
	}

	// The balances the commands give, applied in each account's order.
	want := ledger.NewMemState()
	for a, steps := range scenarios {
		for _, s := range steps {
			if s.body.Amount > 0 {
				_ = ledger.Apply(want, ledger.Command{CommandID: s.key, Type: s.typ, Account: s.account, Amount: s.body.Amount, HoldID: s.body.HoldID})
			}
		}
		_ = a
	}
	// The API's outbox has published every command, the worker applied them.
	k.WaitCaughtUp()
	got, err := ledger.Balances(ctx, k.Pool(), k.Schema())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want.Accounts) {
		t.Errorf("%d accounts, want %d", len(got), len(want.Accounts))
	}
	for id, acc := range want.Accounts {
		if got[id] != acc {
			t.Errorf("account %s: %+v, want %+v", id, got[id], acc)
		}
	}
	// One command per distinct request on the topic, none other.
	seen := map[string]int{}
	for _, m := range k.Read(k.Topic()) {
		var c ledger.Command
		if err := json.Unmarshal([]byte(m.Payload), &c); err != nil {
			t.Fatal(err)
		}
		if _, ok := accepted[c.CommandID]; !ok {
			t.Fatalf("a command no client was told of: %s", m.Payload)
		}
		seen[c.CommandID]++
	}
	if len(seen) != len(accepted) {
		t.Fatalf("%d distinct commands on the topic, want %d", len(seen), len(accepted))
	}
	var rejected int
	if err := k.Pool().QueryRow(ctx, "SELECT count(*) FROM rejections").Scan(&rejected); err != nil {
		t.Fatal(err)
	}
	if rejected != accounts {
		t.Fatalf("%d rejections, want %d (one over-capture per account)", rejected, accounts)
	}
	if got := want.Accounts["acc-0"]; got.Available != 100-40+10+20+5 || got.Held != 0 {
		t.Fatalf("expected balance of acc-0 miscomputed: %+v", got)
	}
}

package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// chaosStep is one request of a tenant's scenario.
type chaosStep struct {
	key, typ, account string
	body              ledger.APIRequest
}

// chaosAnswer is an answer a client received in full.
type chaosAnswer struct {
	status   int
	body     string
	replayed bool
}

// chaosStats counts what the clients went through.
type chaosStats struct {
	requests, lost, timeouts, conflicts, unavailable, replayed atomic.Int64
}

// TestAPIThroughBadNetwork drives the ledger's HTTP API on real Postgres
// and Kafka through a proxy (toxiproxy, in process) that delays every
// answer and drops some after the server answered: reset (reset_peer) or
// held until the client times out (timeout). Every client retries with the
// same Idempotency-Key; each request is sent by several clients at once and
// once more after; tenants (X-Client) use the same key values, for other
// requests and for requests identical to another tenant's. The audit, on
// state: each distinct (tenant, key) request applied once (the accounts
// table against the balances recomputed from the accepted requests, and
// Verify on the commands topic), one command on the topic per accepted
// request and none other, one key per request, every answer to a (tenant,
// key) the same, and no tenant given another's command. On both key
// layouts.
func TestAPIThroughBadNetwork(t *testing.T) {
	t.Parallel()
	for _, layout := range []pgstore.Layout{pgstore.LayoutSingleTable, pgstore.LayoutPartitioned} {
		t.Run(layout.String(), func(t *testing.T) {
			t.Parallel()
			badNetwork(t, layout)
		})
	}
}

func badNetwork(t *testing.T, layout pgstore.Layout) {
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	commands := kafkatest.Topic(t, 3)
	group := kafkatest.Name("g")
	quiet := slog.New(slog.DiscardHandler)
	w, err := ledger.NewWorker(db.Pool, ledger.Config{Schema: db.Schema, Brokers: brokers, Commands: commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, KeyLayout: layout, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	api, err := ledger.NewAPI(ctx, db.Pool, ledger.APIConfig{Schema: db.Schema, Commands: commands, KeyLayout: layout, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()

	// The proxy, on the answers (downstream): every one delayed 0–60 ms;
	// on 12 % of the connections the answer's first bytes reset the
	// connection instead of reaching the client (reset_peer); on 8 % the
	// answer is dropped and the connection closed when the server closes
	// it (timeout); on 8 % the answer is held 2 s, past the client's
	// timeout (latency).
	proxy := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "api", "127.0.0.1:0", srv.Listener.Addr().String())
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	defer proxy.Stop()
	for _, js := range []string{
		`{"name":"delay","type":"latency","stream":"downstream","attributes":{"latency":30,"jitter":30}}`,
		`{"name":"reset","type":"reset_peer","stream":"downstream","toxicity":0.12,"attributes":{"timeout":0}}`,
		`{"name":"drop","type":"timeout","stream":"downstream","toxicity":0.08,"attributes":{"timeout":0}}`,
		`{"name":"stall","type":"latency","stream":"downstream","toxicity":0.08,"attributes":{"latency":2000}}`,
	} {
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			t.Fatalf("toxic %s: %v", js, err)
		}
	}
	base := "http://" + proxy.Listen
	// One connection per request, so that each meets the toxics anew.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	// Each tenant's accounts run the same scenario under the same key
	// values; and every tenant tops up the shared account under the same
	// keys with the same bodies: one request per tenant all the same.
	tenants := []string{"t1", "t2", "t3"}
	const accounts, copies = 3, 3
	var scenarios [][]chaosStep
	owner := map[int]string{} // scenario → tenant
	for _, tn := range tenants {
		for a := range accounts {
			acc, hold := fmt.Sprintf("%s-acc-%d", tn, a), fmt.Sprintf("%s-h-%d", tn, a)
			k := func(i int) string { return fmt.Sprintf("acc-%d-step-%d", a, i) }
			owner[len(scenarios)] = tn
			scenarios = append(scenarios, []chaosStep{
				{k(0), ledger.Topup, acc, ledger.APIRequest{Amount: 100}},
				{k(1), ledger.Hold, acc, ledger.APIRequest{Amount: 40, HoldID: hold}},
				{k(2), ledger.Capture, acc, ledger.APIRequest{Amount: 30, HoldID: hold}},
				{k(3), ledger.Capture, acc, ledger.APIRequest{Amount: 50, HoldID: hold}}, // over the hold: rejected by the worker
				{k(4), ledger.Release, acc, ledger.APIRequest{Amount: 10, HoldID: hold}},
				{k(5), ledger.Refund, acc, ledger.APIRequest{Amount: 20, HoldID: hold}},
				{k(6), ledger.Topup, acc, ledger.APIRequest{Amount: 5}},
				{k(7), ledger.Topup, acc, ledger.APIRequest{Amount: -5}}, // refused by the API: 400, stored
			})
		}
		owner[len(scenarios)] = tn
		scenarios = append(scenarios, []chaosStep{
			{"shared-0", ledger.Topup, "shared", ledger.APIRequest{Amount: 10}},
			{"shared-1", ledger.Topup, "shared", ledger.APIRequest{Amount: 20}},
			{"shared-2", ledger.Topup, "shared", ledger.APIRequest{Amount: 30}},
		})
	}

	var st chaosStats
	post := func(tenant string, s chaosStep) (chaosAnswer, error) {
		body, _ := json.Marshal(s.body)
		wait := 10 * time.Millisecond
		for attempt := 1; ; attempt++ {
			if attempt > 200 {
				return chaosAnswer{}, fmt.Errorf("%s/%s: no answer in 200 attempts", tenant, s.key)
			}
			st.requests.Add(1)
			req, _ := http.NewRequest(http.MethodPost, base+"/accounts/"+s.account+"/"+s.typ, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", strconv.Quote(s.key))
			req.Header.Set("X-Client", tenant)
			resp, err := client.Do(req)
			var b []byte
			if err == nil {
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				st.timeouts.Add(1)
			case err != nil: // reset, or closed without an answer
				st.lost.Add(1)
			case resp.StatusCode == http.StatusConflict:
				st.conflicts.Add(1)
			case resp.StatusCode == http.StatusServiceUnavailable:
				st.unavailable.Add(1)
			default:
				replayed := resp.Header.Get("Idempotent-Replayed") == "true"
				if replayed {
					st.replayed.Add(1)
				}
				return chaosAnswer{resp.StatusCode, string(b), replayed}, nil
			}
			time.Sleep(wait) // the client's back-off before its retry
			wait = min(2*wait, 200*time.Millisecond)
		}
	}
	var mu sync.Mutex
	answers := map[string][]chaosAnswer{} // tenant/key → every answer received
	var wg sync.WaitGroup
	start := time.Now()
	for i, steps := range scenarios {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := owner[i]
			for _, s := range steps {
				got := make([]chaosAnswer, copies+1)
				errs := make([]error, copies+1)
				var cw sync.WaitGroup
				for c := range copies {
					cw.Add(1)
					go func() { defer cw.Done(); got[c], errs[c] = post(tenant, s) }()
				}
				cw.Wait()
				got[copies], errs[copies] = post(tenant, s) // a retry after the answer
				if err := errors.Join(errs...); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answers[tenant+"/"+s.key] = append(answers[tenant+"/"+s.key], got...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	sent := time.Since(start)

	// Every answer to a (tenant, key) the same; a 202 carries the command
	// of that tenant's request, and no command went to two requests.
	accepted := map[string]ledger.Command{} // command ID → command
	byRequest := map[string]string{}        // tenant/key → command ID
	stored := 0
	for i, steps := range scenarios {
		tenant := owner[i]
		for _, s := range steps {
			key := tenant + "/" + s.key
			got := answers[key]
			for _, a := range got {
				if a.status != got[0].status || a.body != got[0].body {
					t.Errorf("%s: answers differ: %+v", key, got)
					break
				}
			}
			stored++
			if s.body.Amount <= 0 {
				if got[0].status != http.StatusBadRequest {
					t.Errorf("%s: %+v, want 400", key, got[0])
				}
				continue
			}
			var c ledger.Command
			if got[0].status != http.StatusAccepted || json.Unmarshal([]byte(got[0].body), &c) != nil {
				t.Errorf("%s: %+v, want 202 and its command", key, got[0])
				continue
			}
			if c.Account != s.account || c.Type != s.typ || c.Amount != s.body.Amount {
				t.Errorf("%s: tenant %s got the command %+v, not its own request's %+v", key, tenant, c, s)
			}
			if other, ok := byRequest[c.CommandID]; ok {
				t.Errorf("command %s answered to %s and to %s", c.CommandID, other, key)
			}
			byRequest[c.CommandID] = key
			accepted[c.CommandID] = c
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Wait for the commands to be published and consumed, then compare.
	testenv.WaitFor(t, time.Minute, "the outbox to publish the commands", func() bool {
		var pending int
		err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("exactly_outbox")+" WHERE topic = $1 AND status <> 'PUBLISHED'", commands).Scan(&pending)
		return err == nil && pending == 0
	})
	end := kafkatest.EndOffsets(t, commands, 3)
	testenv.WaitFor(t, time.Minute, "the worker to consume the commands", func() bool {
		got := kafkatest.CommittedOffsets(t, group, commands, 3)
		for p, o := range end {
			if got[p] < o {
				return false
			}
		}
		return true
	})
	// One command per accepted request on the topic, none other.
	onTopic := map[string]int{}
	recs := kafkatest.ReadAll(t, commands, 3, time.Minute)
	for _, m := range recs {
		var id string
		for _, h := range m.Headers {
			if h.Key == kafkapubsub.UUIDHeader {
				id = string(h.Value)
			}
		}
		if _, ok := accepted[id]; !ok {
			t.Errorf("a command no client was told of: %s", m.Value)
		}
		onTopic[id]++
	}
	if len(onTopic) != len(accepted) {
		t.Errorf("%d distinct commands on the topic, want %d (one per accepted request)", len(onTopic), len(accepted))
	}
	// The balances of each accepted request applied once, in each
	// account's order (the shared account's top-ups commute).
	want := ledger.NewMemState()
	for i, steps := range scenarios {
		for _, s := range steps {
			if s.body.Amount > 0 {
				_ = ledger.Apply(want, ledger.Command{CommandID: owner[i] + "/" + s.key, Type: s.typ, Account: s.account, Amount: s.body.Amount, HoldID: s.body.HoldID})
			}
		}
	}
	got, err := ledger.Balances(ctx, db.Pool, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	var diff []string
	for id, acc := range want.Accounts {
		if got[id] != acc {
			diff = append(diff, fmt.Sprintf("%s: %+v, want %+v", id, got[id], acc))
		}
	}
	for id := range got {
		if _, ok := want.Accounts[id]; !ok {
			diff = append(diff, fmt.Sprintf("%s: %+v, want none", id, got[id]))
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Errorf("balances differ from each accepted request applied once:\n%s", strings.Join(diff, "\n"))
	}
	if s := want.Accounts["shared"]; s.Available != int64(len(tenants))*60 {
		t.Fatalf("expected balance of the shared account miscomputed: %+v", s)
	}
	// replay verify's check: the balances recomputed from the topic.
	rep, err := ledger.Verify(ctx, db.Pool, db.Schema, brokers, commands)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Match() || rep.Unique != len(accepted) || rep.KeyReused != 0 || rep.Malformed != 0 {
		t.Errorf("verify: %+v, want %d unique commands and the balances matching", rep, len(accepted))
	}
	var keys int
	countKeys := "SELECT count(*) FROM " + db.Keys() + " WHERE scope = $1"
	if err := db.Pool.QueryRow(ctx, countKeys, ledger.APIScope).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != stored {
		t.Errorf("%d keys stored, want %d (one per distinct tenant and key)", keys, stored)
	}
	t.Logf("%s: %d requests in %v for %d distinct requests (%d accepted, %d on the topic in %d records): %d answers lost (connection reset or closed), %d timeouts, %d 409, %d 503, %d answers replayed",
		layout, st.requests.Load(), sent.Round(time.Millisecond), stored, len(accepted), len(onTopic), len(recs), st.lost.Load(), st.timeouts.Load(),
		st.conflicts.Load(), st.unavailable.Load(), st.replayed.Load())
	// The network must have got in the way, or the test proved nothing.
	if st.lost.Load() == 0 || st.timeouts.Load() == 0 || st.replayed.Load() == 0 {
		t.Fatalf("the proxy dropped no answer (lost %d, timeouts %d, replays %d): the test exercised nothing",
			st.lost.Load(), st.timeouts.Load(), st.replayed.Load())
	}
}

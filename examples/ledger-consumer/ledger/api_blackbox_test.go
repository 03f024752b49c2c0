package ledger_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactly-go/exactly/examples/ledger-consumer/ledger"
	"github.com/exactly-go/exactly/httpkey/retry"
	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/internal/testkit/testenv"
)

// The ledger's API driven over TCP as clients meet it: a client that
// half-closes its side after sending, a client whose first attempt times
// out under a slow server and retries with its key (409 while the first
// runs, then the stored answer), and every client again after a database
// restore lost the API's side of their requests. The balances are audited:
// each top-up applied once, every answer a success only for what
// committed.
func TestAPIOverTCPAsClientsMeetIt(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	ctx := context.Background()
	if err := ledger.Setup(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	commands, group := kafkatest.Topic(t, 2), kafkatest.Name("g")
	quiet := slog.New(slog.DiscardHandler)
	w, err := ledger.NewWorker(db.Pool, ledger.Config{Schema: db.Schema, Brokers: brokers, Commands: commands,
		Events: kafkatest.Topic(t, 1), DeadLetter: kafkatest.Topic(t, 1), Group: group, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	api, err := ledger.NewAPI(ctx, db.Pool, ledger.APIConfig{Schema: db.Schema, Commands: commands, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// A slow server: the first request of each key takes 400ms.
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		mu.Lock()
		first := !seen[k]
		seen[k] = true
		mu.Unlock()
		if first {
			time.Sleep(400 * time.Millisecond)
		}
		api.ServeHTTP(rw, r)
	}))
	defer srv.Close()

	halfClosed := func(account, key string, amount int) (int, string) {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := fmt.Sprintf(`{"amount":%d}`, amount)
		fmt.Fprintf(conn, "POST /accounts/%s/topup HTTP/1.1\r\nHost: x\r\nX-Client: c\r\nIdempotency-Key: \"%s\"\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", account, key, len(body), body)
		_ = conn.(*net.TCPConn).CloseWrite()
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	client := &http.Client{Transport: retry.New(nil, &retry.Config{AttemptTimeout: 150 * time.Millisecond, MaxAttempts: 20,
		FirstDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxRetryAfter: 300 * time.Millisecond})}
	retried := func(account, key string, amount int) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/accounts/"+account+"/topup", strings.NewReader(fmt.Sprintf(`{"amount":%d}`, amount)))
		req.Header.Set("X-Client", "c")
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type topup struct {
		account, key string
		amount       int
		send         func(account, key string, amount int) (int, string)
	}
	topups := []topup{
		{"acc-1", "h-1", 10, halfClosed}, {"acc-1", "r-1", 20, retried}, {"acc-2", "h-2", 30, halfClosed},
		{"acc-2", "r-2", 40, retried}, {"acc-1", "r-3", 50, retried},
	}
	answers := map[string]string{}
	for _, tp := range topups {
		code, body := tp.send(tp.account, tp.key, tp.amount)
		if code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", tp.key, code, body)
		}
		answers[tp.key] = body
	}
	balances := func() (int64, int64) {
		got, err := ledger.Balances(ctx, db.Pool, db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		return got["acc-1"].Available, got["acc-2"].Available
	}
	testenv.WaitFor(t, time.Minute, "the top-ups applied", func() bool { a, b := balances(); return a == 80 && b == 70 })

	// The restore: the API's keys and outbox rows are gone, the commands
	// they sent are in Kafka and applied. Every client sends again.
	db.DeleteKeys(t, ledger.APIScope)
	if _, err := db.Pool.Exec(ctx, "DELETE FROM "+db.Table("exactly_outbox")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	clear(seen)
	mu.Unlock()
	for _, tp := range topups {
		code, body := tp.send(tp.account, tp.key, tp.amount)
		if code != http.StatusAccepted || body != answers[tp.key] {
			t.Fatalf("%s after the restore: %d %s, want the first answer %s", tp.key, code, body, answers[tp.key])
		}
	}
	// Ten commands at least: the relay publishes at least once, so a write
	// retried under load can put a command on the topic twice (the worker
	// skips the copy); a command missing keeps the sum short.
	testenv.WaitFor(t, time.Minute, "every command consumed", func() bool {
		end, committed := kafkatest.EndOffsets(t, commands, 2), kafkatest.CommittedOffsets(t, group, commands, 2)
		return end[0]+end[1] >= 10 && committed[0] == end[0] && committed[1] == end[1]
	})
	if a, b := balances(); a != 80 || b != 70 {
		t.Fatalf("balances %d and %d, want 80 and 70: a top-up was applied twice", a, b)
	}
}

package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
)

// HTTPCounts is what the demo's clients sent to the ledger's HTTP API and
// what came of it.
type HTTPCounts struct {
	// Addr is the API's address.
	Addr string
	// Requests counts every request sent; Retried those that repeated an
	// earlier one after a timeout, a lost connection, a 409 or a 503
	// (Timeouts, Conflicts and Unavailable count those causes);
	// Duplicates those sent again on purpose after an answer; Replayed
	// the answers that carried Idempotent-Replayed: true.
	Requests, Retried, Timeouts, Conflicts, Unavailable, Duplicates, Replayed int64
	// Accepted counts the distinct requests answered 202.
	Accepted int
	// Commands counts the records the outbox put on the commands topic for
	// them: one distinct command per accepted request.
	Commands TopicCount
	// Elapsed is the time from the first request to the last answer,
	// Published to the last accepted command on the topic.
	Elapsed, Published time.Duration
}

// apiClient posts commands to the ledger's API as a client that retries:
// the same Idempotency-Key for every attempt of a command.
type apiClient struct {
	base, principal string
	http            *http.Client
	maxAttempts     int

	requests, retried, timeouts, conflicts, unavailable, duplicates, replayed atomic.Int64
}

// apiAnswer is an answer of the API.
type apiAnswer struct {
	status   int
	body     []byte
	replayed bool
}

// post sends one command under key until it gets an answer that is not
// 409 or 503, retrying after a timeout or a lost connection.
func (c *apiClient) post(ctx context.Context, key string, cmd Command) (apiAnswer, error) {
	body, err := json.Marshal(APIRequest{Amount: cmd.Amount, HoldID: cmd.HoldID})
	if err != nil {
		return apiAnswer{}, err
	}
	url := c.base + "/accounts/" + cmd.Account + "/" + cmd.Type
	wait := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			c.retried.Add(1)
		}
		c.requests.Add(1)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return apiAnswer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", strconv.Quote(key))
		req.Header.Set("X-Client", c.principal)
		a, err := c.do(req)
		switch {
		case ctx.Err() != nil:
			return apiAnswer{}, ctx.Err()
		case err != nil:
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.timeouts.Add(1)
			}
		case a.status == http.StatusConflict:
			c.conflicts.Add(1)
		case a.status == http.StatusServiceUnavailable:
			c.unavailable.Add(1)
		default:
			if a.replayed {
				c.replayed.Add(1)
			}
			return a, nil
		}
		if attempt == c.maxAttempts {
			if err == nil {
				err = fmt.Errorf("status %d: %s", a.status, a.body)
			}
			return apiAnswer{}, fmt.Errorf("ledger: POST %s (key %s): %d attempts: %w", url, key, attempt, err)
		}
		select {
		case <-ctx.Done():
			return apiAnswer{}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func (c *apiClient) do(req *http.Request) (apiAnswer, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return apiAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return apiAnswer{}, err
	}
	return apiAnswer{status: resp.StatusCode, body: b, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

// postWorkload sends the workload's commands (the first copy of each
// valid record) to the API at base, each account's in order, the
// accounts by a few clients at once; it re-sends a share dupShare of them
// on purpose after their answer and checks that the replay is the same
// answer. It returns the API's command for each workload command ID.
func postWorkload(ctx context.Context, c *apiClient, cmds []Command, dupShare float64, seed uint64) (map[string]Command, error) {
	var order []string
	byAccount := map[string][]Command{}
	for _, cmd := range cmds {
		if _, ok := byAccount[cmd.Account]; !ok {
			order = append(order, cmd.Account)
		}
		byAccount[cmd.Account] = append(byAccount[cmd.Account], cmd)
	}
	accounts := make(chan string, len(order))
	for _, a := range order {
		accounts <- a
	}
	close(accounts)
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	ctx, cancel := context.WithCancel(ctx) // the first error stops the others
	defer cancel()
	var mu sync.Mutex
	accepted := make(map[string]Command, len(cmds))
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(i)))
			for a := range accounts {
				for _, cmd := range byAccount[a] {
					got, err := postOnce(ctx, c, cmd, rnd.Float64() < dupShare, rnd.IntN(2) == 0)
					var api Command
					if err == nil {
						err = json.Unmarshal(got.body, &api)
					}
					if err != nil {
						errs <- err
						cancel()
						return
					}
					mu.Lock()
					accepted[cmd.CommandID] = api
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return accepted, nil
}

// postOnce posts cmd and, when dup, a duplicate of it: at the same time
// (concurrent) or after the answer. A duplicate must get the first
// request's answer, replayed, and every answer must be a 202.
func postOnce(ctx context.Context, c *apiClient, cmd Command, dup, concurrent bool) (apiAnswer, error) {
	if !dup {
		got, err := c.post(ctx, cmd.CommandID, cmd)
		if err == nil && got.status != http.StatusAccepted {
			err = fmt.Errorf("ledger: %s of %s refused: %d %s", cmd.Type, cmd.Account, got.status, got.body)
		}
		return got, err
	}
	c.duplicates.Add(1)
	var got, again apiAnswer
	var err, errAgain error
	if concurrent {
		done := make(chan struct{})
		go func() { defer close(done); again, errAgain = c.post(ctx, cmd.CommandID, cmd) }()
		got, err = c.post(ctx, cmd.CommandID, cmd)
		<-done
	} else if got, err = c.post(ctx, cmd.CommandID, cmd); err == nil {
		again, errAgain = c.post(ctx, cmd.CommandID, cmd)
	}
	switch {
	case err != nil:
		return got, err
	case errAgain != nil:
		return got, errAgain
	case got.status != http.StatusAccepted || again.status != got.status || !bytes.Equal(again.body, got.body) || !got.replayed && !again.replayed:
		return got, fmt.Errorf("ledger: %s of %s and its duplicate got %d %s (replayed %v) and %d %s (replayed %v)",
			cmd.Type, cmd.Account, got.status, got.body, got.replayed, again.status, again.body, again.replayed)
	}
	return got, nil
}

// splitWorkload separates the workload's commands (the first copy of
// each valid record: the API's requests) from the records that follow
// them on the topic directly (duplicates, key reuses, malformed records).
func splitWorkload(recs []kafka.Message) (cmds []Command, extra []kafka.Message) {
	seen := map[string]bool{}
	for _, m := range recs {
		id := uuidOf(m)
		c, err := Parse(m.Value)
		if seen[id] || err != nil || id == "" {
			extra = append(extra, m)
			continue
		}
		seen[id] = true
		cmds = append(cmds, c)
	}
	return cmds, extra
}

// rewriteExtra gives the records that repeat a workload command the ID
// and payload of the API's command: a duplicate becomes a byte-identical
// copy of the record the outbox published, a key reuse that copy with
// the workload's other amount.
func rewriteExtra(extra []kafka.Message, workload map[string]Command, accepted map[string]Command) ([]kafka.Message, error) {
	out := make([]kafka.Message, 0, len(extra))
	for _, m := range extra {
		api, ok := accepted[uuidOf(m)]
		if !ok { // malformed: as generated
			out = append(out, m)
			continue
		}
		if c, err := Parse(m.Value); err == nil {
			api.Amount += c.Amount - workload[c.CommandID].Amount
		}
		payload, err := json.Marshal(api)
		if err != nil {
			return nil, err
		}
		out = append(out, kafka.Message{Key: []byte(api.Account), Value: payload,
			Headers: []kafka.Header{{Key: kafkapubsub.UUIDHeader, Value: []byte(api.CommandID)}}})
	}
	return out, nil
}

func uuidOf(m kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == kafkapubsub.UUIDHeader {
			return string(h.Value)
		}
	}
	return ""
}

// demoHTTP serves the API on cfg.APIAddr, posts the workload's commands
// to it, waits until the worker's relay has put them on the commands
// topic, then produces the workload's other records there directly.
func demoHTTP(ctx context.Context, pool *pgxpool.Pool, cfg DemoConfig, wcfg Config, sum *Summary) error {
	api, err := NewAPI(ctx, pool, APIConfig{Schema: cfg.Schema, Commands: wcfg.Commands, KeyLayout: wcfg.KeyLayout, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("ledger: --api-addr: %w", err)
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	// The API's process publishes its outbox with a relay of its own.
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: wcfg.Brokers, Security: wcfg.Security,
		Partitioner: wcfg.Partitioner, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: cfg.Schema}, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	var relayErr error
	exited := make(chan struct{})
	go func() { relayErr = relay.Run(rctx); close(exited) }()
	stopRelay := func() error { cancel(); <-exited; return relayErr }
	defer func() { _ = stopRelay() }() // on an error: its own first
	sum.HTTP.Addr = ln.Addr().String()
	cmds, extra := splitWorkload(sum.Workload.Records)
	workload := make(map[string]Command, len(cmds))
	for _, c := range cmds {
		workload[c.CommandID] = c
	}
	c := &apiClient{base: "http://" + sum.HTTP.Addr, principal: "demo", maxAttempts: 20,
		http: &http.Client{Timeout: 10 * time.Second}}
	start := time.Now()
	accepted, err := postWorkload(ctx, c, cmds, cfg.Load.Duplicates, cfg.Load.Seed)
	h := &sum.HTTP
	h.Requests, h.Retried, h.Timeouts, h.Conflicts = c.requests.Load(), c.retried.Load(), c.timeouts.Load(), c.conflicts.Load()
	h.Unavailable, h.Duplicates, h.Replayed, h.Accepted = c.unavailable.Load(), c.duplicates.Load(), c.replayed.Load(), len(accepted)
	h.Elapsed = time.Since(start)
	if err != nil {
		return err
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "  HTTP: %d commands accepted in %v; waiting for the outbox to publish them …\n", len(accepted), h.Elapsed.Round(time.Millisecond))
	}
	// Every accepted request's command on the topic, before the records
	// that repeat them.
	kc := &kafka.Client{Addr: kafka.TCP(wcfg.Brokers...), Timeout: 10 * time.Second}
	for wait, deadline := 20*time.Millisecond, time.Now().Add(2*time.Minute); ; wait = min(2*wait, 500*time.Millisecond) {
		end, err := endOffsets(ctx, kc, wcfg.Commands, 6)
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		var n int64
		for _, o := range end {
			n += o
		}
		if n >= int64(len(accepted)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ledger: the outbox published %d of %d accepted commands in 2 minutes", n, len(accepted))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("ledger: the API's relay stopped: %v", relayErr)
		case <-time.After(wait):
		}
	}
	h.Published = time.Since(start)
	if err := stopRelay(); err != nil {
		return fmt.Errorf("ledger: the API's relay: %w", err)
	}
	if h.Commands, err = countTopic(ctx, wcfg.Brokers, wcfg.Commands); err != nil {
		return err
	}
	recs, err := rewriteExtra(extra, workload, accepted)
	if err != nil {
		return err
	}
	return Produce(ctx, wcfg.Brokers, wcfg.Commands, recs)
}

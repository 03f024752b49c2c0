package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/internal/testkit/kafkatest"
	"github.com/exactly-go/exactly/internal/testkit/pgtest"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/outbox"
)

// BenchmarkE2E measures the whole path a user's command takes: a POST to
// the ledger's HTTP API (NewAPI: httpkey, the command written to the
// outbox in the request's transaction), the API's outbox relay putting it
// on the commands topic, and the ledger's worker (NewWorker) applying it,
// per message and in batch mode (batches of up to 500). Beside them, in the
// same run, the two physical limits the path stands on: the commit rate of
// this Postgres (one client, single-row INSERT, each its own transaction,
// synchronous_commit on) and Kafka's produce round trip (acks=all, one
// record at a time).
//
// A command counts as applied when the worker's transaction that applied
// it commits. The ledger's tables keep no time per command, so the
// benchmark's schema (and nothing else) gets an unlogged table of
// applied times, filled by a deferred constraint trigger on the outbox
// insert of the command's event ("evt-" + its ID) in the worker's
// transaction: deferred, it runs at the commit, just before the commit
// record is flushed, and clock_timestamp() there is the applied time. The
// send time is the client's clock before the request is written; both
// clocks are this machine's (checked at the start).
//
// Each mode runs two phases on fresh topics and schema: first
// E2E_CLIENTS (16) clients post E2E_N_PER_MESSAGE (1 500) or E2E_N_BATCH
// (3 000) topups back to back, which gives the most requests per second
// from the first request sent to the last command applied (req/s) and the
// API's own rate (http-req/s); then requests are sent at half that rate
// (or E2E_RATE_PER_MESSAGE, E2E_RATE_BATCH), each at its time whatever
// the others' answers, for E2E_SECONDS (4) seconds, whose times from sent
// to applied give p50-ms and p99-ms; p50-answer-ms is the median time from
// sent to the API's 202, and p50-to-topic-ms to the record's time on the
// commands topic (set by the API relay's producer as it sends the record).
// Run:
//
//	go test -run '^$' -bench E2E -benchtime 1x -count 3 ./examples/ledger-consumer/ledger
func BenchmarkE2E(b *testing.B) {
	b.Run("floor-commit", func(b *testing.B) {
		for range b.N {
			benchCommitFloor(b)
		}
	})
	b.Run("floor-produce", func(b *testing.B) {
		for range b.N {
			benchProduceFloor(b)
		}
	})
	for _, mode := range []struct {
		name    string
		batch   int
		n       int
		rateEnv string
	}{
		{"per-message", 0, envInt("E2E_N_PER_MESSAGE", 1500), "E2E_RATE_PER_MESSAGE"},
		{"batch", throughputBatchSize, envInt("E2E_N_BATCH", 3000), "E2E_RATE_BATCH"},
	} {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				e2eRun(b, mode.batch, mode.n, envInt(mode.rateEnv, 0))
			}
		})
	}
}

// floorDuration is how long each physical limit is measured.
const floorDuration = 3 * time.Second

// benchCommitFloor commits single-row INSERTs on one connection, each its
// own transaction (one round trip), for floorDuration.
func benchCommitFloor(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewEmpty(b)
	if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+db.Table("commits")+" (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		b.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		b.Fatal(err)
	}
	var on string
	if err := conn.QueryRow(ctx, "SHOW fsync").Scan(&on); err != nil || on != "on" {
		b.Fatalf("fsync is %q (%v): the commit rate would not be the disk's", on, err)
	}
	insert := "INSERT INTO " + db.Table("commits") + " DEFAULT VALUES"
	var lat []time.Duration
	start := time.Now()
	for time.Since(start) < floorDuration {
		t := time.Now()
		if _, err := conn.Exec(ctx, insert); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	elapsed := time.Since(start)
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+db.Table("commits")).Scan(&rows); err != nil {
		b.Fatal(err)
	}
	if rows != len(lat) {
		b.Fatalf("%d rows committed, want %d", rows, len(lat))
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "commits/s")
	reportPercentiles(b, lat)
}

// benchProduceFloor produces one record at a time with acks=all, each
// write waiting for the broker's answer, for floorDuration.
func benchProduceFloor(b *testing.B) {
	ctx := context.Background()
	brokers := kafkatest.Brokers(b)
	topic := kafkatest.Topic(b, 1)
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: 1, BatchTimeout: time.Millisecond}
	defer wr.Close()
	value := bytes.Repeat([]byte("x"), 120) // about a command's size
	var lat []time.Duration
	start := time.Now()
	for time.Since(start) < floorDuration {
		t := time.Now()
		if err := wr.WriteMessages(ctx, kafka.Message{Key: []byte("acc-001"), Value: value}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	elapsed := time.Since(start)
	end := kafkatest.EndOffsets(b, topic, 1)
	if end[0] != int64(len(lat)) {
		b.Fatalf("%d records on the topic, want %d", end[0], len(lat))
	}
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "records/s")
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// e2eAccounts is how many accounts the topups go to.
const e2eAccounts = 200

// e2eRun serves the API, runs its relay and the worker (batch mode when
// batch > 0), and measures the two phases of BenchmarkE2E.
func e2eRun(b *testing.B, batch, n, rate int) {
	ctx := context.Background()
	brokers := kafkatest.Brokers(b)
	db := pgtest.NewEmpty(b)
	if err := migrations.Migrate(ctx, db.Pool, &migrations.Config{Schema: db.Schema}); err != nil {
		b.Fatal(err)
	}
	if err := Setup(ctx, db.Pool, db.Schema); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
CREATE UNLOGGED TABLE `+db.Table("e2e_applied")+` (command_id text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION `+db.Table("e2e_applied")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO `+db.Table("e2e_applied")+` (command_id) VALUES (substr(NEW.uuid, 5)) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER e2e_applied AFTER INSERT ON `+db.Table("exactly_outbox")+`
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.uuid LIKE 'evt-%')
    EXECUTE FUNCTION `+db.Table("e2e_applied")+`();`); err != nil {
		b.Fatal(err)
	}
	checkClock(b, db.Pool)
	// The API and the worker are two processes: a pool each.
	apiPool, workerPool := e2ePool(b), e2ePool(b)
	commands, events, dlq := kafkatest.Topic(b, 6), kafkatest.Topic(b, 3), kafkatest.Topic(b, 1)
	log := slog.New(slog.DiscardHandler)
	api, err := NewAPI(ctx, apiPool, APIConfig{Schema: db.Schema, Commands: commands, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: brokers, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(apiPool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: db.Schema}, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	w, err := NewWorker(workerPool, Config{Schema: db.Schema, Brokers: brokers, Commands: commands, Events: events, DeadLetter: dlq,
		Group: kafkatest.Name("g"), Batch: batch, Registry: prometheus.NewRegistry(), Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- relay.Run(runCtx) })
	wg.Go(func() { errs <- w.Run(runCtx) })
	defer func() {
		stop()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil && runCtx.Err() == nil {
				b.Error(err)
			}
		}
	}()
	select {
	case <-w.Running():
	case err := <-errs:
		b.Fatalf("stopped before consuming: %v", err)
	case <-time.After(time.Minute):
		b.Fatal("the worker did not consume within a minute")
	}
	c := &e2eClient{base: srv.URL, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}}}
	a := newE2EApplied(db)

	// Phase 1: clients back to back.
	clients := envInt("E2E_CLIENTS", 16)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	sends := make([]e2eSend, n)
	var cwg sync.WaitGroup
	for range clients {
		cwg.Go(func() {
			for i := range next {
				sends[i] = c.post(b, i)
			}
		})
	}
	cwg.Wait()
	if b.Failed() {
		return
	}
	lastAnswer := slices.MaxFunc(sends, func(x, y e2eSend) int { return x.answered.Compare(y.answered) }).answered
	applied := a.wait(b, n)
	first := sends[0].sent
	for _, s := range sends {
		if s.sent.Before(first) {
			first = s.sent
		}
	}
	last := first
	for _, s := range sends {
		if t := applied[s.id]; t.After(last) {
			last = t
		}
	}
	reqPerSec := float64(n) / last.Sub(first).Seconds()
	b.ReportMetric(reqPerSec, "req/s")
	b.ReportMetric(float64(n)/lastAnswer.Sub(first).Seconds(), "http-req/s")

	// Phase 2: at a fixed rate, each request sent at its time.
	if rate == 0 {
		rate = max(int(reqPerSec/2), 1)
	}
	total := rate * envInt("E2E_SECONDS", 4)
	paced := make([]e2eSend, total)
	per := max(rate/100, 1) // every 10ms
	tick := time.NewTicker(10 * time.Millisecond)
	var pwg sync.WaitGroup
	for i := 0; i < total; i += per {
		<-tick.C
		for j := i; j < min(i+per, total); j++ {
			pwg.Go(func() { paced[j] = c.post(b, n+j) })
		}
	}
	tick.Stop()
	pwg.Wait()
	if b.Failed() {
		return
	}
	applied = a.wait(b, n+total)
	lat := make([]time.Duration, 0, total)
	for _, s := range paced {
		lat = append(lat, applied[s.id].Sub(s.sent))
	}
	b.ReportMetric(float64(rate), "rate-req/s")
	reportPercentiles(b, lat)
	// Where the time went: to the commands topic (the record's time, set
	// by the API relay's producer as it sent the record) and from there.
	onTopic := map[string]time.Time{}
	for _, m := range kafkatest.ReadAll(b, commands, 6, time.Minute) {
		onTopic[uuidOf(m)] = m.Time
	}
	toTopic, answer := make([]time.Duration, 0, total), make([]time.Duration, 0, total)
	for _, s := range paced {
		answer = append(answer, s.answered.Sub(s.sent))
		t, ok := onTopic[s.id]
		if !ok {
			b.Fatalf("command %s is not on the commands topic", s.id)
		}
		toTopic = append(toTopic, t.Sub(s.sent))
	}
	slices.Sort(toTopic)
	slices.Sort(answer)
	b.ReportMetric(float64(answer[len(answer)/2].Microseconds())/1000, "p50-answer-ms")
	b.ReportMetric(float64(toTopic[len(toTopic)/2].Microseconds())/1000, "p50-to-topic-ms")

	// Every topup applied once.
	var sum int64
	if err := db.Pool.QueryRow(ctx, "SELECT coalesce(sum(available), 0) FROM "+db.Table("accounts")).Scan(&sum); err != nil {
		b.Fatal(err)
	}
	if sum != int64(n+total) {
		b.Fatalf("balances sum to %d, want %d", sum, n+total)
	}
}

// checkClock fails unless Postgres's clock reads between two readings of
// the benchmark's: the applied times are compared with the send times.
func checkClock(b *testing.B, pool *pgxpool.Pool) {
	before := time.Now()
	var pg time.Time
	if err := pool.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&pg); err != nil {
		b.Fatal(err)
	}
	after := time.Now()
	if pg.Before(before.Add(-time.Millisecond)) || pg.After(after.Add(time.Millisecond)) {
		b.Fatalf("Postgres's clock reads %v, the benchmark's between %v and %v: run them on one machine", pg, before, after)
	}
}

func e2ePool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgtest.Config(pgtest.RequireURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// e2eClient posts topups to the API, each with a fresh Idempotency-Key.
type e2eClient struct {
	base string
	http *http.Client
}

// e2eSend is one request: its command's ID, when it was sent and when its
// answer (a 202) came back.
type e2eSend struct {
	id             string
	sent, answered time.Time
}

func (c *e2eClient) post(b *testing.B, i int) e2eSend {
	body, _ := json.Marshal(APIRequest{Amount: 1})
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/accounts/acc-%03d/%s", c.base, i%e2eAccounts, Topup), bytes.NewReader(body))
	if err != nil {
		b.Error(err)
		return e2eSend{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", strconv.Quote(uuid.Must(uuid.NewV7()).String()))
	req.Header.Set("X-Client", "e2e")
	s := e2eSend{sent: time.Now()}
	resp, err := c.http.Do(req)
	if err != nil {
		b.Error(err)
		return s
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	s.answered = time.Now()
	if err != nil || resp.StatusCode != http.StatusAccepted {
		b.Errorf("POST: %d %s (%v)", resp.StatusCode, got, err)
		return s
	}
	var cmd Command
	if err := json.Unmarshal(got, &cmd); err != nil || cmd.CommandID == "" {
		b.Errorf("POST answered %s (%v)", got, err)
	}
	s.id = cmd.CommandID
	return s
}

// e2eApplied reads the applied times the benchmark's trigger records.
type e2eApplied struct {
	db *pgtest.DB
}

func newE2EApplied(db *pgtest.DB) *e2eApplied { return &e2eApplied{db: db} }

// wait polls until n commands are applied (two minutes at most) and
// returns every applied time by command ID.
func (a *e2eApplied) wait(b *testing.B, n int) map[string]time.Time {
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var got int
		if err := a.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+a.db.Table("e2e_applied")).Scan(&got); err != nil {
			b.Fatal(err)
		}
		if got >= n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d commands applied after two minutes", got, n)
		}
		<-tick.C
	}
	rows, err := a.db.Pool.Query(ctx, "SELECT command_id, applied_at FROM "+a.db.Table("e2e_applied"))
	if err != nil {
		b.Fatal(err)
	}
	out := make(map[string]time.Time, n)
	var id string
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil }); err != nil {
		b.Fatal(err)
	}
	return out
}

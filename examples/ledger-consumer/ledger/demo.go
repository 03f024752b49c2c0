package ledger

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/migrations"
)

// DefaultDatabaseURL is used when DATABASE_URL is not set.
const DefaultDatabaseURL = "postgres://postgres:postgres@localhost:5432/postgres"

// DemoConfig configures Demo.
type DemoConfig struct {
	// DatabaseURL defaults to DefaultDatabaseURL, and while DATABASE_URL is
	// unset and nothing answers there, to a throwaway server (db.go).
	DatabaseURL string
	// Schema is dropped and re-created. Defaults to "ledger_demo".
	Schema string
	// Brokers; when empty an in-process Kafka broker is started. On a
	// real broker the demo deletes its topics and groups when it ends.
	Brokers []string
	// Load is the workload. Defaults to DefaultLoad() when zero.
	Load LoadConfig
	// Progress receives a line per second while the worker runs; nil for none.
	Progress io.Writer
	// NoDedupe runs the worker without the dedupe middleware.
	NoDedupe bool
	// Replay consumes the whole topic a second time with a new consumer
	// group (same handler scope) after the first pass: every record is then
	// a redelivery, and the balances must not move.
	Replay bool
	// Batch, when above 0, consumes the same topic once more in batch mode
	// (Config.Batch), into a schema of its own (Schema + "_batch") with its
	// own events and dead-letter topics, verifies those balances too and
	// reports both modes' rates. Defaults to 0: per-message mode only.
	Batch int
	// APIAddr is where the demo serves the ledger's HTTP API (NewAPI); its
	// load generator posts the workload's commands there, each with an
	// Idempotency-Key, retrying on timeouts, lost connections, 409 and
	// 503 and re-sending a share (Load.Duplicates) on purpose, and an
	// outbox relay of the API's puts them on the commands topic. The
	// workload's duplicates, key reuses and malformed records then go to
	// the topic directly, as a producer that bypasses the API would send
	// them, and the worker consumes the topic as without the API. "off"
	// produces the whole workload to Kafka directly. Defaults to
	// "127.0.0.1:0" (an ephemeral loopback port).
	APIAddr string
	Logger  *slog.Logger
}

// Summary is the demo's result.
type Summary struct {
	// Verify is what Verify found on the topic and in Postgres.
	Verify Report
	// Workload is what was produced.
	Workload Workload
	// Worker counts what the worker's middleware saw.
	Worker  Counts
	Elapsed time.Duration
	// Replayed counts the second pass (DemoConfig.Replay).
	Replayed      Counts
	ReplayElapsed time.Duration
	// Events and DeadLetters count what reached those topics, after every
	// run.
	Events, DeadLetters TopicCount
	Broker              string
	// Batched counts the batch-mode pass (DemoConfig.Batch), BatchElapsed
	// its duration, BatchVerify its balances, and BatchEvents and
	// BatchDeadLetters its own events and dead-letter topics.
	Batched                       Counts
	BatchSize                     int
	BatchElapsed                  time.Duration
	BatchVerify                   Report
	BatchEvents, BatchDeadLetters TopicCount
	// HTTP counts the requests to the API (DemoConfig.APIAddr); zero when
	// it is off.
	HTTP HTTPCounts
	// Topics are the demo's commands, events and dead-letter topics; on a
	// real broker they are deleted when the demo ends.
	Topics []string
}

// TopicCount counts a topic's records, their distinct UUIDs, those that
// carry the dead-letter reason, and the copies of a UUID whose payload
// differs from its first copy. With the middleware each command emits one
// event; a publish retried after a lost answer may write a record twice
// (Kafka producers are at-least-once), always byte-identical, so consumers
// deduplicate it by its UUID. Each pass over the commands dead-letters each
// record it rejects, with its reason (a replay dead-letters them again).
type TopicCount struct {
	Records, Distinct, WithReason, Conflicting int
}

// Counts are the worker's totals.
type Counts struct {
	Applied, Duplicates, KeyReused, DeadLettered, Rejected int64
}

// Match reports whether the balances are as expected.
func (s Summary) Match() bool {
	return s.Verify.Match() && (s.BatchElapsed == 0 || s.BatchVerify.Match())
}

// Print writes the summary for people.
func (s Summary) Print(w io.Writer) {
	match := "yes"
	if !s.Match() {
		match = "NO"
	}
	fmt.Fprintf(w, `
ledger demo (%s)
  records produced     %d (%d commands, %d duplicates, %d key reuses, %d malformed)
  applied              %d (each command once; rule violations included)
  duplicates skipped   %d
  rejected by rules    %d (recorded and emitted as events)
  key reuse caught     %d
  dead-lettered        %d
  accounts             %d
  elapsed              %v (%.0f records/s)
  balances match       %s
`, s.Broker, s.Verify.Records, s.Workload.Unique, s.Workload.Duplicates, s.Workload.KeyReused, s.Workload.Malformed,
		s.Worker.Applied, s.Worker.Duplicates, s.Worker.Rejected, s.Worker.KeyReused, s.Worker.DeadLettered, s.Verify.Accounts,
		s.Elapsed.Round(time.Millisecond), float64(s.Verify.Records)/s.Elapsed.Seconds(), match)
	if h := s.HTTP; h.Addr != "" {
		fmt.Fprintf(w, "  HTTP API             %s: %d commands accepted in %v, all on the topic after %v\n",
			h.Addr, h.Accepted, h.Elapsed.Round(time.Millisecond), h.Published.Round(time.Millisecond))
		fmt.Fprintf(w, "  HTTP requests        %d sent: %d retried (%d timeouts, %d 409, %d 503), %d duplicates on purpose, %d answers replayed\n",
			h.Requests, h.Retried, h.Timeouts, h.Conflicts, h.Unavailable, h.Duplicates, h.Replayed)
		fmt.Fprintf(w, "  commands via outbox  %d records, %d distinct (one per accepted request)\n", h.Commands.Records, h.Commands.Distinct)
	}
	if s.ReplayElapsed > 0 {
		fmt.Fprintf(w, "  replayed the topic   %d records in %v (%.0f records/s): %d applied again, %d duplicates skipped\n",
			s.Verify.Records, s.ReplayElapsed.Round(time.Millisecond), float64(s.Verify.Records)/s.ReplayElapsed.Seconds(),
			s.Replayed.Applied, s.Replayed.Duplicates)
	}
	passes := "the run"
	if s.ReplayElapsed > 0 {
		passes = "both passes"
	}
	fmt.Fprintf(w, "  events topic         %d records, %d distinct (after %s)\n", s.Events.Records, s.Events.Distinct, passes)
	fmt.Fprintf(w, "  dead-letter topic    %d records, %d with a reason (after %s)\n", s.DeadLetters.Records, s.DeadLetters.WithReason, passes)
	for _, m := range s.Verify.Mismatches {
		fmt.Fprintln(w, "  mismatch:", m)
	}
	if s.BatchElapsed > 0 {
		match := "yes"
		if !s.BatchVerify.Match() {
			match = "NO"
		}
		fmt.Fprintf(w, `
  per-message mode     %.0f records/s (one transaction per command)
  batch mode (%d)     %.0f records/s (one transaction per batch, set-based SQL), into a schema of its own:
                       %d applied, %d duplicates skipped, %d rejected, %d key reuses caught, %d dead-lettered;
                       balances match %s; events %d distinct; dead letters %d with a reason
`, float64(s.Verify.Records)/s.Elapsed.Seconds(), s.BatchSize, float64(s.BatchVerify.Records)/s.BatchElapsed.Seconds(),
			s.Batched.Applied, s.Batched.Duplicates, s.Batched.Rejected, s.Batched.KeyReused, s.Batched.DeadLettered,
			match, s.BatchEvents.Distinct, s.BatchDeadLetters.WithReason)
		for _, m := range s.BatchVerify.Mismatches {
			fmt.Fprintln(w, "  batch mode mismatch:", m)
		}
	}
}

// Demo migrates, produces a workload with duplicates and bad inputs,
// consumes it with the worker until the group has caught up, and verifies
// the balances.
func Demo(ctx context.Context, cfg DemoConfig) (Summary, error) {
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = DefaultDatabaseURL
	}
	if cfg.Schema == "" {
		cfg.Schema = "ledger_demo"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.APIAddr == "" {
		cfg.APIAddr = "127.0.0.1:0"
	}
	if cfg.Load == (LoadConfig{}) {
		cfg.Load = DefaultLoad()
	}
	var sum Summary
	if err := cfg.Load.Validate(); err != nil {
		return sum, err
	}
	pool, release, err := openDemoDB(ctx, cfg)
	if err != nil {
		return sum, err
	}
	defer release()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{cfg.Schema}.Sanitize()+" CASCADE"); err != nil {
		return sum, fmt.Errorf("ledger: reset schema: %w", err)
	}
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: cfg.Schema}); err != nil {
		return sum, err
	}
	if err := Setup(ctx, pool, cfg.Schema); err != nil {
		return sum, err
	}
	realBroker := len(cfg.Brokers) > 0
	sum.Broker = "Kafka at " + fmt.Sprint(cfg.Brokers)
	if len(cfg.Brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return sum, fmt.Errorf("ledger: in-process Kafka: %w", err)
		}
		defer cluster.Close()
		cfg.Brokers = cluster.ListenAddrs()
		sum.Broker = "in-process Kafka broker"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	wcfg := Config{Schema: cfg.Schema, Brokers: cfg.Brokers, Commands: "ledger.commands." + run, Events: "ledger.events." + run,
		DeadLetter: "ledger.dlq." + run, Group: "ledger-demo-" + run, NoDedupe: cfg.NoDedupe, Logger: cfg.Logger}
	if err := createTopics(ctx, cfg.Brokers, map[string]int{wcfg.Commands: 6, wcfg.Events: 3, wcfg.DeadLetter: 1}); err != nil {
		return sum, err
	}
	sum.Topics = []string{wcfg.Commands, wcfg.Events, wcfg.DeadLetter}
	if realBroker {
		defer func() {
			removeDemo(ctx, cfg.Brokers, cfg.Logger, sum.Topics, []string{wcfg.Group, wcfg.Group + "-replay", wcfg.Group + "-batch"})
		}()
	}
	if sum.Workload, err = Generate(cfg.Load); err != nil {
		return sum, err
	}
	if cfg.APIAddr == "off" {
		err = Produce(ctx, cfg.Brokers, wcfg.Commands, sum.Workload.Records)
	} else {
		err = demoHTTP(ctx, pool, cfg, wcfg, &sum)
	}
	if err != nil {
		return sum, err
	}
	if sum.Worker, sum.Elapsed, err = runUntilCaughtUp(ctx, pool, wcfg, cfg.Progress, len(sum.Workload.Records)); err != nil {
		return sum, err
	}
	if cfg.Replay {
		// A new group for the same scope: it takes the scope over on
		// purpose (worker.Config.TakeOver), to find every command a
		// duplicate.
		wcfg.Group += "-replay"
		wcfg.TakeOver = true
		if sum.Replayed, sum.ReplayElapsed, err = runUntilCaughtUp(ctx, pool, wcfg, cfg.Progress, len(sum.Workload.Records)); err != nil {
			return sum, err
		}
	}
	if sum.Verify, err = Verify(ctx, pool, cfg.Schema, cfg.Brokers, wcfg.Commands); err != nil {
		return sum, err
	}
	if cfg.Batch > 0 {
		if err := demoBatch(ctx, pool, cfg, wcfg, &sum); err != nil {
			return sum, err
		}
	}
	if sum.Events, err = countTopic(ctx, cfg.Brokers, wcfg.Events); err != nil {
		return sum, err
	}
	sum.DeadLetters, err = countTopic(ctx, cfg.Brokers, wcfg.DeadLetter)
	return sum, err
}

// countTopic reads a topic that the workers are done with (each published
// its outbox before it returned).
func countTopic(ctx context.Context, brokers []string, topic string) (TopicCount, error) {
	parts, err := readTopic(ctx, brokers, topic)
	if err != nil {
		return TopicCount{}, err
	}
	var n TopicCount
	seen := map[string][]byte{}
	for _, p := range parts {
		for _, m := range p {
			n.Records++
			for _, h := range m.Headers {
				switch {
				case h.Key == kafkapubsub.UUIDHeader:
					first, ok := seen[string(h.Value)]
					if !ok {
						seen[string(h.Value)] = m.Value
						n.Distinct++
					} else if !bytes.Equal(first, m.Value) {
						n.Conflicting++
					}
				case h.Key == middleware.ReasonForPoisonedKey && len(h.Value) > 0:
					n.WithReason++
				}
			}
		}
	}
	return n, nil
}

// runUntilCaughtUp runs a worker until its group has consumed the whole
// commands topic, and returns its counts and how long it took.
func runUntilCaughtUp(ctx context.Context, pool *pgxpool.Pool, wcfg Config, progress io.Writer, total int) (Counts, time.Duration, error) {
	worker, err := NewWorker(pool, wcfg)
	if err != nil {
		return Counts{}, 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- worker.Run(wctx) }()
	if err := waitCaughtUp(ctx, wcfg.Brokers, wcfg.Group, wcfg.Commands, worker, progress, total, done); err != nil {
		stop()
		if !errors.Is(err, errWorkerStopped) {
			<-done // waitCaughtUp did not read it
		}
		return Counts{}, 0, err
	}
	elapsed := time.Since(start)
	if first := worker.Metrics.First(); !first.IsZero() && first.After(start) {
		elapsed = time.Since(first) // from the first message on: not the group's join
	}
	stop()
	if err := <-done; err != nil {
		return Counts{}, 0, err
	}
	m := worker.Metrics
	return Counts{Applied: m.Applied.Load(), Duplicates: m.Duplicates.Load(), KeyReused: m.KeyReused.Load(),
		DeadLettered: m.DeadLettered.Load(), Rejected: m.Rejected.Load()}, elapsed, nil
}

// demoBatch consumes the demo's commands topic in batch mode into a schema
// of its own, with its own group, events and dead-letter topics, and
// verifies its balances.
func demoBatch(ctx context.Context, pool *pgxpool.Pool, cfg DemoConfig, wcfg Config, sum *Summary) error {
	schema := cfg.Schema + "_batch"
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("ledger: reset schema: %w", err)
	}
	defer func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		return err
	}
	if err := Setup(ctx, pool, schema); err != nil {
		return err
	}
	bcfg := wcfg
	bcfg.Schema, bcfg.Batch = schema, cfg.Batch
	bcfg.Group = strings.TrimSuffix(wcfg.Group, "-replay") + "-batch"
	bcfg.Events, bcfg.DeadLetter = wcfg.Events+".batch", wcfg.DeadLetter+".batch"
	if err := createTopics(ctx, cfg.Brokers, map[string]int{bcfg.Events: 3, bcfg.DeadLetter: 1}); err != nil {
		return err
	}
	sum.Topics = append(sum.Topics, bcfg.Events, bcfg.DeadLetter)
	var err error
	sum.BatchSize = cfg.Batch
	if sum.Batched, sum.BatchElapsed, err = runUntilCaughtUp(ctx, pool, bcfg, cfg.Progress, len(sum.Workload.Records)); err != nil {
		return err
	}
	if sum.BatchVerify, err = Verify(ctx, pool, schema, cfg.Brokers, wcfg.Commands); err != nil {
		return err
	}
	if sum.BatchEvents, err = countTopic(ctx, cfg.Brokers, bcfg.Events); err != nil {
		return err
	}
	sum.BatchDeadLetters, err = countTopic(ctx, cfg.Brokers, bcfg.DeadLetter)
	return err
}

package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
	"github.com/exactly-go/exactly/internal/pgtx"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures a Worker.
type Config struct {
	// Schema holds the ledger's and exactly's tables. Defaults to "ledger".
	Schema string
	// Brokers to consume from and publish to. Required.
	Brokers []string
	// Security holds the Kafka connection's TLS and SASL settings. Defaults
	// to plain TCP.
	Security kafkapubsub.Security
	// Partitioner spreads the events over partitions by key; match the
	// events topic's other producers. Defaults to murmur2.
	Partitioner kafkapubsub.Partitioner
	// Commands, Events and DeadLetter are the topics. Default to
	// "ledger.commands", "ledger.events" and "ledger.dlq".
	Commands, Events, DeadLetter string
	// Group is the consumer group. Defaults to "ledger-consumer".
	Group string
	// SessionTimeout is how long the group waits for a silent member
	// before it hands the member's partitions to the others: the time from
	// a crash to its partitions being consumed again. Heartbeats go out
	// every tenth of it. Defaults to the Subscriber's (10s).
	SessionTimeout time.Duration
	// KeyFunc and FingerprintFunc are the middleware's (consumer.Config).
	// Default to the message UUID and the SHA-256 of the payload's bytes.
	KeyFunc         consumer.KeyFunc
	FingerprintFunc dedupe.FingerprintFunc
	// NoDedupe switches the dedupe middleware off: each command runs in a
	// transaction of its own with no key, as a naive consumer would. Only
	// for measurements and for proving that the replay tool catches it.
	NoDedupe bool
	// Batch, when above 0, consumes in batch mode: up to Batch commands at
	// a time, each batch claimed, applied set-based and committed in one
	// transaction (consumer.BatchConsumer, handleBatch), on a Subscriber
	// that keeps up to Batch messages of a partition in flight. Defaults to
	// 0: one transaction per command, through a Watermill router.
	Batch int
	// MetricsAddr serves /metrics and /healthz when set. The command line
	// binds 127.0.0.1:9090 unless told otherwise: the metrics and the
	// health of a worker are for its operators, not for every host that can
	// reach it. Defaults to "": no server.
	MetricsAddr string
	// CreateTopics creates the commands (6 partitions), events (3) and
	// dead-letter (1) topics when they are missing, before consuming.
	// Defaults to false: the topics must exist (or the broker create them).
	CreateTopics bool
	// Backoff is the longest wait between two attempts to reach Postgres
	// and Kafka at start-up. Defaults to 10s.
	Backoff time.Duration
	// Registry receives the metrics. Defaults to a new registry.
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Schema == "" {
		c.Schema = "ledger"
	}
	if c.Commands == "" {
		c.Commands = "ledger.commands"
	}
	if c.Events == "" {
		c.Events = "ledger.events"
	}
	if c.DeadLetter == "" {
		c.DeadLetter = "ledger.dlq"
	}
	if c.Group == "" {
		c.Group = "ledger-consumer"
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Backoff <= 0 {
		c.Backoff = 10 * time.Second
	}
}

// Scope is the dedupe scope of the ledger handler.
const Scope = "ledger-consumer"

// Worker is the ledger consumer: a Watermill router with the kafka-go
// Subscriber, the dedupe middleware and the outbox relay.
type Worker struct {
	cfg     Config
	pool    *pgxpool.Pool
	store   *pgstore.Store
	writer  *outbox.Writer
	Metrics *Metrics
	running chan struct{}
	// batching is set while the batch consumer runs (batch mode has no router).
	batching atomic.Bool
	// down lists the dependencies found unavailable at start-up, until the
	// router runs.
	down atomic.Pointer[[]string]
}

// NewWorker prepares a worker. Run migrations and Setup first.
func NewWorker(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	cfg.defaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("ledger: Config.Brokers is empty: set KAFKA_BROKERS")
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: cfg.Schema, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	writer, err := outbox.NewWriter(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, pool: pool, store: store, writer: writer, Metrics: NewMetrics(cfg.Registry), running: make(chan struct{})}
	w.down.Store(&[]string{"starting"})
	return w, nil
}

// Running is closed once the router runs.
func (w *Worker) Running() <-chan struct{} { return w.running }

type eventPayload struct {
	CommandID string `json:"command_id"`
	Type      string `json:"type"`
	Account   string `json:"account"`
	Outcome   string `json:"outcome"` // applied or rejected
	Reason    string `json:"reason,omitempty"`
	Available int64  `json:"available"`
	Held      int64  `json:"held"`
}

// handle applies one command in tx and returns the event to emit.
func (w *Worker) handle(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
	c, err := Parse(msg.Payload)
	if err != nil {
		return nil, err
	}
	st := &txState{ctx: ctx, tx: tx, schema: w.cfg.Schema}
	ev := eventPayload{CommandID: c.CommandID, Type: c.Type, Account: c.Account, Outcome: "applied"}
	if err := Apply(st, c); err != nil {
		var rej *Rejection
		if !errors.As(err, &rej) {
			return nil, err
		}
		ev.Outcome, ev.Reason = "rejected", rej.Reason
		if _, err := tx.Exec(ctx, "INSERT INTO "+st.t("rejections")+" (command_id, type, account, reason) VALUES ($1, $2, $3, $4) ON CONFLICT (command_id) DO NOTHING",
			c.CommandID, c.Type, c.Account, rej.Reason); err != nil {
			return nil, err
		}
		defer w.Metrics.onRejected()
	}
	acc, err := st.Account(c.Account)
	if err != nil {
		return nil, err
	}
	ev.Available, ev.Held = acc.Available, acc.Held
	payload, _ := json.Marshal(ev)
	// The event's UUID derives from the command's, so even a consumer without
	// the middleware emits recognisable events.
	out := message.NewMessage("evt-"+c.CommandID, payload)
	out.Metadata.Set(outbox.KeyMetadata, c.Account)
	return []*message.Message{out}, nil
}

// naive runs the handler in a transaction of its own, with no key.
func (w *Worker) naive(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer pgtx.Rollback(ctx, tx)
	outs, err := w.handle(ctx, tx, msg)
	if err != nil {
		return nil, err
	}
	if err := w.writer.WriteTx(ctx, tx, w.cfg.Events, outs...); err != nil {
		return nil, err
	}
	return nil, tx.Commit(ctx)
}

// Run consumes until ctx is done, then drains and returns. It serves
// /metrics and /healthz first; then, while Postgres (with the ledger's and
// exactly's tables) or Kafka cannot be reached, it waits and tries again
// with back-off, /healthz answering 503 with the dependencies that are
// down, and starts consuming once both answer.
func (w *Worker) Run(ctx context.Context) error {
	log := w.cfg.Logger
	var srv *http.Server
	var router *message.Router
	var routerMu sync.Mutex
	if w.cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(w.cfg.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(rw http.ResponseWriter, r *http.Request) {
			routerMu.Lock()
			rt := router
			routerMu.Unlock()
			var down []string
			if (rt == nil || !rt.IsRunning()) && !w.batching.Load() {
				down = *w.down.Load()
			} else {
				cctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
				down = w.probe(cctx, false)
				cancel()
			}
			if len(down) > 0 {
				// Names only: the errors (hosts, users, databases) go to the log.
				http.Error(rw, "unavailable: "+strings.Join(down, ", "), http.StatusServiceUnavailable)
				return
			}
			_, _ = rw.Write([]byte("ok\n"))
		})
		ln, err := net.Listen("tcp", w.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("ledger: metrics listener on %s: %w", w.cfg.MetricsAddr, err)
		}
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("ledger: serving /metrics and /healthz", "addr", ln.Addr().String())
	}
	if !w.waitReady(ctx) {
		return nil
	}
	return w.consume(ctx, func(r *message.Router) {
		routerMu.Lock()
		router = r
		routerMu.Unlock()
	})
}

// consume runs the router, the relay and the key cleanup until ctx is
// done; it hands the router to setRouter before running it.
func (w *Worker) consume(ctx context.Context, setRouter func(*message.Router)) error {
	log := w.cfg.Logger
	pub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.cfg.Brokers, Security: w.cfg.Security, Partitioner: w.cfg.Partitioner, Logger: log})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := kafkapubsub.NewSubscriber(&kafkapubsub.SubscriberConfig{Brokers: w.cfg.Brokers, Security: w.cfg.Security, ConsumerGroup: w.cfg.Group, Logger: log,
		SessionTimeout: w.cfg.SessionTimeout, HeartbeatInterval: w.cfg.SessionTimeout / 10, MaxInFlight: max(w.cfg.Batch, 1)})
	if err != nil {
		return err
	}
	var router *message.Router
	var batch *consumer.BatchConsumer
	if w.cfg.Batch > 0 {
		if batch, err = w.batchConsumer(pub); err != nil {
			return err
		}
	} else if router, err = w.router(sub, pub); err != nil {
		return err
	}
	if err := kafkapubsub.CheckTTL(ctx, w.cfg.Brokers, w.cfg.Security, w.cfg.Commands, w.store.Config().TTL); err != nil {
		log.Warn("ledger: key retention", "err", err)
	}

	// The relay has a publisher of its own: the router closes the
	// handlers' publisher when it stops, and the relay's final flush comes
	// after that.
	relayPub, err := kafkapubsub.NewPublisher(&kafkapubsub.PublisherConfig{Brokers: w.cfg.Brokers, Security: w.cfg.Security, Partitioner: w.cfg.Partitioner, Logger: log})
	if err != nil {
		return err
	}
	defer relayPub.Close()
	relay, err := outbox.NewRelay(w.pool, relayPub, &outbox.RelayConfig{Config: outbox.Config{Schema: w.cfg.Schema}, Hooks: w.Metrics, Logger: log, PollInterval: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(relayCtx) }()
	go func() { defer wg.Done(); _ = w.store.RunCleanup(relayCtx, time.Minute, nil) }()

	if batch != nil {
		defer sub.Close()
		w.batching.Store(true)
		close(w.running)
		start := time.Now()
		err = batch.Subscribe(ctx, sub, w.cfg.Commands)
		w.batching.Store(false)
		n := w.Metrics.Applied.Load() + w.Metrics.Duplicates.Load()
		log.Info("ledger: batch mode stopped", "messages", n, "elapsed", time.Since(start).Round(time.Millisecond),
			"messages_per_s", int(float64(n)/time.Since(start).Seconds()))
	} else {
		setRouter(router)
		go func() {
			<-router.Running()
			close(w.running)
		}()
		err = router.Run(ctx)
	}
	stopRelay()
	wg.Wait()
	// Publish what the last handlers wrote before the relay stopped (a
	// batch commits hundreds of events at once: the relay may be behind).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	for {
		n, ferr := relay.RunOnce(fctx)
		if ferr != nil {
			log.Warn("ledger: final outbox flush failed; the next run publishes it", "err", ferr)
			break
		}
		if n == 0 {
			break
		}
	}
	cancel()
	return err
}

// waitReady probes Postgres and Kafka until both answer, with back-off
// from 100ms up to Config.Backoff. It reports false when ctx ends first.
func (w *Worker) waitReady(ctx context.Context) bool {
	wait := backoff.New(100*time.Millisecond, w.cfg.Backoff)
	for {
		down := w.probe(ctx, w.cfg.CreateTopics)
		if ctx.Err() != nil {
			return false
		}
		if len(down) == 0 {
			w.down.Store(&[]string{"consumer"}) // until the router runs
			return true
		}
		w.down.Store(&down)
		d := wait.Next()
		w.cfg.Logger.Warn("ledger: waiting for dependencies", "down", strings.Join(down, ", "), "retry_in", d)
		if clock.Sleep(ctx, d) != nil {
			return false
		}
	}
}

// probe checks the worker's dependencies and returns the names of those
// that are down ("database", "database schema", "kafka"); it logs why.
// With create the Kafka check creates the worker's missing topics.
func (w *Worker) probe(ctx context.Context, create bool) []string {
	log := w.cfg.Logger
	var down []string
	if missing, err := w.missingTables(ctx); err != nil {
		log.Warn("ledger: Postgres unavailable", "err", redact.Password(err.Error()))
		down = append(down, "database")
	} else if len(missing) > 0 {
		log.Warn("ledger: the schema lacks tables: run `ledger-consumer migrate` with a role that may create them, or start the worker with --migrate",
			"schema", w.cfg.Schema, "missing", strings.Join(missing, ", "))
		down = append(down, "database schema")
	}
	var err error
	if create {
		err = createTopicsWith(ctx, w.cfg.Brokers, w.cfg.Security, map[string]int{w.cfg.Commands: 6, w.cfg.Events: 3, w.cfg.DeadLetter: 1})
	} else {
		err = pingKafka(ctx, w.cfg.Brokers, w.cfg.Security, w.cfg.Commands)
	}
	if err != nil {
		log.Warn("ledger: Kafka unavailable", "err", err)
		down = append(down, "kafka")
	}
	return down
}

// missingTables lists the tables of the ledger and of exactly that the
// schema lacks. It needs no privilege on them.
func (w *Worker) missingTables(ctx context.Context) ([]string, error) {
	want := []string{w.store.Config().Table, "exactly_outbox", "accounts", "holds", "rejections"}
	names := make([]string, len(want))
	for i, t := range want {
		names[i] = pgx.Identifier{w.cfg.Schema, t}.Sanitize()
	}
	var missing []string
	err := w.pool.QueryRow(ctx, "SELECT coalesce(array_agg(n) FILTER (WHERE to_regclass(n) IS NULL), '{}') FROM unnest($1::text[]) AS n", names).Scan(&missing)
	if err != nil {
		return nil, fmt.Errorf("ledger: check the schema %s: %w", w.cfg.Schema, err)
	}
	return missing, nil
}

// pingKafka asks the brokers for topic's metadata, on connections of its
// own: a shared transport would answer from connections it keeps to
// brokers it learnt of earlier.
func pingKafka(ctx context.Context, brokers []string, sec kafkapubsub.Security, topic string) error {
	tr := sec.Transport()
	tr.DialTimeout, tr.IdleTimeout = 3*time.Second, time.Second
	defer tr.CloseIdleConnections()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: tr}
	if _, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}}); err != nil {
		return fmt.Errorf("ledger: Kafka at %s: %w", strings.Join(brokers, ","), err)
	}
	return nil
}

// router is the per-message mode: a Watermill router with the dedupe
// middleware (or none, with NoDedupe).
func (w *Worker) router(sub *kafkapubsub.Subscriber, pub *kafkapubsub.Publisher) (*message.Router, error) {
	log := w.cfg.Logger
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NewSlogLogger(log))
	if err != nil {
		return nil, err
	}
	poison, err := middleware.PoisonQueueWithFilter(pub, w.cfg.DeadLetter, dedupe.IsPermanent)
	if err != nil {
		return nil, err
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2, ShouldRetry: consumer.ShouldRetry, ResetContextOnRetry: true}
	router.AddMiddleware(poison, retry.Middleware, middleware.Timeout(30*time.Second))
	if w.cfg.NoDedupe {
		log.Warn("ledger: the dedupe middleware is OFF: redeliveries will be applied again")
		router.AddConsumerHandler(Scope, w.cfg.Commands, sub, func(msg *message.Message) error { _, err := w.naive(msg); return err })
		router.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				start := time.Now()
				outs, err := next(msg)
				outcome := consumer.OutcomeApplied
				if err != nil {
					outcome = consumer.OutcomeFailed
				}
				w.Metrics.OnMessage(msg.Context(), consumer.Event{Outcome: outcome, Duration: time.Since(start), Err: err})
				return outs, err
			}
		}, middleware.Recoverer)
	} else {
		mw, err := consumer.NewMiddleware(w.store, &consumer.Config{
			Scope: Scope, KeyFunc: w.cfg.KeyFunc, FingerprintFunc: w.cfg.FingerprintFunc,
			Outputs: w.writer.Outputs(w.cfg.Events), Hooks: w.Metrics, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		router.AddMiddleware(mw.Middleware, middleware.Recoverer)
		// A handler with outputs (AddHandler, not AddConsumerHandler, which
		// drops them before the middleware sees them). The middleware
		// writes them to the outbox in the command's transaction and
		// returns nothing for the router to publish.
		router.AddHandler(Scope, w.cfg.Commands, sub, w.cfg.Events, pub, consumer.TxHandler(w.handle))
	}
	return router, nil
}

// batchConsumer is the batch mode: a consumer.BatchConsumer with the set-based
// handler, the outbox for events and the dead-letter topic.
func (w *Worker) batchConsumer(pub *kafkapubsub.Publisher) (*consumer.BatchConsumer, error) {
	if w.cfg.NoDedupe {
		w.cfg.Logger.Warn("ledger: batch mode WITHOUT deduplication: redeliveries will be applied again")
	}
	return consumer.NewBatchConsumer(w.store, w.handleBatch, &consumer.BatchConfig{
		Scope: Scope, KeyFunc: w.cfg.KeyFunc, FingerprintFunc: w.cfg.FingerprintFunc,
		Outputs: w.writer.Outputs(w.cfg.Events), Hooks: w.Metrics, Logger: w.cfg.Logger,
		MaxSize: w.cfg.Batch, Workers: batchWorkers, Publisher: pub, DeadLetterTopic: w.cfg.DeadLetter, NoDedupe: w.cfg.NoDedupe,
	})
}

// batchWorkers is how many batches of the worker run at once (its
// partitions spread over them).
const batchWorkers = 3

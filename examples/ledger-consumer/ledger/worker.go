package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/plugin/eprom"
	"github.com/exactly-go/exactly/worker"
	"github.com/exactly-go/exactly/worker/measure"
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
	// TakeOver lets Group take the ledger's commands over from the group
	// that consumed them before (worker.Config.TakeOver): a replay in a new
	// group, a rebuild. Defaults to false.
	TakeOver bool
	// Transport is the Kafka client the worker consumes and publishes
	// with (worker.Config.Transport): kgopubsub.Transport{} for franz-go.
	// Defaults to nil: kafka-go. A share group (kgopubsub.ProtocolShare)
	// is refused: it hands commands out in no order, and an account's
	// commands depend on their order (a capture on its hold).
	Transport worker.Transport
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
	// KeyLayout is how the keys are kept (worker.Config.KeyLayout).
	// Defaults to pgstore.LayoutPartitioned.
	KeyLayout pgstore.Layout
	// CleanupInterval is how often the key clean-up runs
	// (worker.Config.CleanupInterval); with pgstore.LayoutPartitioned it
	// also creates the time partitions ahead. Defaults to 1m.
	CleanupInterval time.Duration
	// MetricsAddr serves /metrics and /healthz when set. The command line
	// binds 127.0.0.1:9090 unless told otherwise: the metrics and the
	// health of a worker are for its operators, not for every host that can
	// reach it. Defaults to "": no server.
	MetricsAddr string
	// Console serves the operator console (package console) at
	// /console/ beside /metrics when set, with MetricsAddr; the worker
	// fills in its brokers, group, topics and schema. Defaults to nil: no
	// console.
	Console *console.Config
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

// Worker is the ledger consumer: the ledger's handlers on a worker.Worker
// (the dedupe middleware or batch mode, the outbox relay, key clean-up),
// with /metrics and /healthz.
type Worker struct {
	cfg     Config
	w       *worker.Worker
	store   *pgstore.Store
	writer  *outbox.Writer
	Metrics *Metrics
}

// NewWorker prepares a worker. Run migrations and Setup first.
func NewWorker(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	cfg.defaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("ledger: Config.Brokers is empty: set KAFKA_BROKERS")
	}
	if s, ok := cfg.Transport.(interface{ SharedGroup() bool }); ok && s.SharedGroup() {
		return nil, errors.New("ledger: Config.Transport consumes a share group, which hands commands out in no order; " +
			"an account's commands depend on their order (a capture or a release on its hold, a refund on its capture): use a consumer group (GroupProtocol classic or consumer)")
	}
	writer, err := outbox.NewWriter(&outbox.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	lw := &Worker{cfg: cfg, writer: writer, Metrics: NewMetrics(cfg.Registry)}
	prom := eprom.New(nil)
	if err := prom.Register(cfg.Registry); err != nil {
		return nil, fmt.Errorf("ledger: register the metrics: %w", err)
	}
	wcfg := &worker.Config{
		Scope: Scope, Topic: cfg.Commands, OutputTopic: cfg.Events, DeadLetterTopic: cfg.DeadLetter, Group: cfg.Group, TakeOver: cfg.TakeOver,
		Brokers: cfg.Brokers, Security: cfg.Security, Partitioner: cfg.Partitioner, SessionTimeout: cfg.SessionTimeout,
		CreateTopics: cfg.CreateTopics, TopicPartitions: 6, Tables: []string{"accounts", "holds", "rejections"}, Schema: cfg.Schema,
		KeyFunc: cfg.KeyFunc, FingerprintFunc: cfg.FingerprintFunc, StartupBackoff: cfg.Backoff,
		Hooks: lw.Metrics, Plugins: []worker.Plugin{prom}, Logger: cfg.Logger,
		KeyLayout: cfg.KeyLayout, CleanupInterval: cfg.CleanupInterval, Transport: cfg.Transport,
	}
	if cfg.NoDedupe {
		wcfg.Plugins = append(wcfg.Plugins, measure.NoDedupe())
	}
	if cfg.Batch > 0 {
		wcfg.BatchHandler, wcfg.BatchSize, wcfg.BatchWorkers = lw.handleBatch, cfg.Batch, batchWorkers
	} else {
		wcfg.Handler = lw.handle
	}
	if lw.w, err = worker.New(pool, wcfg); err != nil {
		return nil, err
	}
	lw.store = lw.w.Store()
	return lw, nil
}

// Running is closed once the worker consumes.
func (w *Worker) Running() <-chan struct{} { return w.w.Running() }

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

// Run consumes until ctx is done, then drains and returns. It serves
// /metrics and /healthz first; then, while Postgres (with the ledger's and
// exactly's tables) or Kafka cannot be reached, it waits and tries again
// with back-off, /healthz answering 503 with the dependencies that are
// down, and starts consuming once both answer.
func (w *Worker) Run(ctx context.Context) error {
	log := w.cfg.Logger
	if w.cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(w.cfg.Registry, promhttp.HandlerOpts{}))
		mux.Handle("/healthz", w.w.HealthHandler())
		served := "/metrics and /healthz"
		if w.cfg.Console != nil {
			c, err := w.w.Console(w.cfg.Console)
			if err != nil {
				return fmt.Errorf("ledger: console: %w", err)
			}
			mux.Handle("/console/", http.StripPrefix("/console", c))
			served = "/metrics, /healthz and /console/"
		}
		ln, err := net.Listen("tcp", w.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("ledger: metrics listener on %s: %w", w.cfg.MetricsAddr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("ledger: serving "+served, "addr", ln.Addr().String())
	}
	start := time.Now()
	err := w.w.Run(ctx)
	if w.cfg.Batch > 0 {
		n := w.Metrics.Applied.Load() + w.Metrics.Duplicates.Load()
		log.Info("ledger: batch mode stopped", "messages", n, "elapsed", time.Since(start).Round(time.Millisecond),
			"messages_per_s", int(float64(n)/time.Since(start).Seconds()))
	}
	return err
}

// batchWorkers is how many batches of the worker run at once (its
// partitions spread over them).
const batchWorkers = 3

package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
	"github.com/exactly-go/exactly/pgstore"
)

// Config configures a Worker.
type Config struct {
	// Schema holds the ledger's and exactly's tables. Defaults to "ledger".
	Schema string
	// Brokers to consume from and publish to. Required.
	Brokers []string
	// Commands, Events and DeadLetter are the topics. Default to
	// "ledger.commands", "ledger.events" and "ledger.dlq".
	Commands, Events, DeadLetter string
	// Group is the consumer group. Defaults to "ledger-consumer".
	Group string
	// NoDedupe switches the dedupe middleware off: each command runs in a
	// transaction of its own with no key, as a naive consumer would. Only
	// for measurements and for proving that the replay tool catches it.
	NoDedupe bool
	// MetricsAddr serves /metrics and /healthz when set (":9090").
	MetricsAddr string
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
	return &Worker{cfg: cfg, pool: pool, store: store, writer: writer, Metrics: NewMetrics(cfg.Registry), running: make(chan struct{})}, nil
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
	defer tx.Rollback(context.WithoutCancel(ctx))
	outs, err := w.handle(ctx, tx, msg)
	if err != nil {
		return nil, err
	}
	if err := w.writer.WriteTx(ctx, tx, w.cfg.Events, outs...); err != nil {
		return nil, err
	}
	return nil, tx.Commit(ctx)
}

// Run consumes until ctx is done, then drains and returns.
func (w *Worker) Run(ctx context.Context) error {
	log := w.cfg.Logger
	pub, err := consumer.NewPublisher(&consumer.PublisherConfig{Brokers: w.cfg.Brokers, Logger: log})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := consumer.NewSubscriber(&consumer.SubscriberConfig{Brokers: w.cfg.Brokers, ConsumerGroup: w.cfg.Group, Logger: log})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NewSlogLogger(log))
	if err != nil {
		return err
	}
	poison, err := middleware.PoisonQueueWithFilter(pub, w.cfg.DeadLetter, dedupe.IsPermanent)
	if err != nil {
		return err
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
			Scope: Scope, Outputs: w.writer.Outputs(w.cfg.Events), Hooks: w.Metrics, Logger: log,
		})
		if err != nil {
			return err
		}
		router.AddMiddleware(mw.Middleware, middleware.Recoverer)
		// A handler with outputs (AddHandler, not AddConsumerHandler, which
		// drops them before the middleware sees them). The middleware
		// writes them to the outbox in the command's transaction and
		// returns nothing for the router to publish.
		router.AddHandler(Scope, w.cfg.Commands, sub, w.cfg.Events, pub, consumer.TxHandler(w.handle))
	}
	if err := consumer.CheckTTL(ctx, w.cfg.Brokers, consumer.Security{}, w.cfg.Commands, w.store.Config().TTL); err != nil {
		log.Warn("ledger: key retention", "err", err)
	}

	relay, err := outbox.NewRelay(w.pool, pub, &outbox.RelayConfig{Config: outbox.Config{Schema: w.cfg.Schema}, Hooks: w.Metrics, Logger: log, PollInterval: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(relayCtx) }()
	go func() { defer wg.Done(); _ = w.store.RunCleanup(relayCtx, time.Minute, nil) }()

	var srv *http.Server
	if w.cfg.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(w.cfg.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(rw http.ResponseWriter, r *http.Request) {
			if !router.IsRunning() {
				http.Error(rw, "router not running", http.StatusServiceUnavailable)
				return
			}
			if err := w.pool.Ping(r.Context()); err != nil {
				http.Error(rw, "database: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = rw.Write([]byte("ok\n"))
		})
		ln, err := net.Listen("tcp", w.cfg.MetricsAddr)
		if err != nil {
			stopRelay()
			return fmt.Errorf("ledger: metrics listener: %w", err)
		}
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		log.Info("ledger: serving /metrics and /healthz", "addr", ln.Addr().String())
	}
	go func() {
		<-router.Running()
		close(w.running)
	}()
	err = router.Run(ctx)
	stopRelay()
	wg.Wait()
	// Publish what the last handlers wrote before the relay stopped.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	if _, ferr := relay.RunOnce(fctx); ferr != nil {
		log.Warn("ledger: final outbox flush failed; the next run publishes it", "err", ferr)
	}
	cancel()
	if srv != nil {
		_ = srv.Close()
	}
	return err
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/backoff"
	"github.com/exactly-go/exactly/internal/clock"
	"github.com/exactly-go/exactly/internal/pooler"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// The dependencies that Health names.
const (
	downStarting = "starting"
	downConsumer = "consumer"
	downDatabase = "database"
	downSchema   = "database schema"
	downKafka    = "kafka"
	downTopics   = "kafka topics"
)

// Health reports whether the worker consumes and its dependencies answer:
// nil, or an error that names what is down ("database", "database
// schema", "kafka", "kafka topics", "starting", "consumer"). Before the
// worker consumes it reports what its start-up found; afterwards it asks
// Postgres and Kafka again (bounded by ctx), and a Subscriber that reports
// its own health (kgopubsub's, whose member the broker refuses to let join
// its group: INCONSISTENT_GROUP_PROTOCOL while kafka-go workers still run
// the group) is "consumer" down.
func (w *Worker) Health(ctx context.Context) error {
	var down []string
	if !w.consuming.Load() {
		down = *w.down.Load()
	} else {
		down = w.probe(ctx, false)
		if w.subHealth != nil {
			if err := w.subHealth(); err != nil {
				w.cfg.Logger.Warn("worker: the consumer does not consume", "err", err)
				down = append(down, downConsumer)
			}
		}
	}
	if len(down) > 0 {
		return fmt.Errorf("unavailable: %s", names(down))
	}
	return nil
}

// HealthHandler serves Health for a /healthz endpoint: 200 "ok", or 503
// with the names of what is down (the reasons, which may name hosts and
// users, go to the log only).
func (w *Worker) HealthHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := w.Health(ctx); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ok\n"))
	})
}

// waitReady probes Postgres and Kafka until both answer, with back-off
// from 100ms up to Config.StartupBackoff, running the migrations and
// creating the topics on the way when the configuration says so. It
// reports false when ctx ends first, or with the reason when no waiting
// can help (singleTableClosed).
func (w *Worker) waitReady(ctx context.Context) (bool, error) {
	wait := backoff.New(100*time.Millisecond, w.cfg.StartupBackoff)
	migrated := !w.cfg.Migrate
	looked := false // at how the pool connects (a transaction pooler)
	for {
		if !looked {
			// A pgx exec mode that a transaction pooler breaks would fail
			// every statement for good, reported as Postgres unavailable.
			if info, err := pooler.Detect(ctx, w.pool); err == nil {
				looked = true
				if err := pooler.CheckExecMode("worker", w.pool, info); err != nil {
					return false, fmt.Errorf("%w (%w)", err, dedupe.ErrMisconfigured)
				}
			}
		}
		if !migrated {
			if err := w.migrate(ctx); err != nil {
				if ctx.Err() != nil {
					return false, nil
				}
				w.cfg.Logger.Warn("worker: migrations failed; trying again", "err", redact.Password(err.Error()))
			} else {
				migrated = true
			}
		}
		down := w.probe(ctx, w.cfg.CreateTopics)
		if ctx.Err() != nil {
			return false, nil
		}
		if err := w.singleTableClosed(ctx, down); err != nil {
			return false, err
		}
		if len(down) == 0 && migrated {
			w.down.Store(&[]string{downConsumer}) // until the consumer runs
			return true, nil
		}
		if !migrated && len(down) == 0 {
			down = []string{downSchema}
		}
		w.down.Store(&down)
		d := wait.Next()
		w.cfg.Logger.Warn("worker: waiting for dependencies", "down", names(down), "retry_in", d)
		if clock.Sleep(ctx, d) != nil {
			return false, nil
		}
	}
}

// probe checks the worker's dependencies and returns the names of those
// that are down; it logs why. With create the Kafka check creates the
// missing topics.
func (w *Worker) probe(ctx context.Context, create bool) []string {
	log := w.cfg.Logger
	var down []string
	if missing, err := w.missingTables(ctx); err != nil {
		log.Warn("worker: Postgres unavailable", "err", redact.Password(err.Error()))
		down = append(down, downDatabase)
	} else if len(missing) > 0 {
		log.Warn("worker: the schema lacks tables: run the migrations (migrations.Migrate, or worker.Config.Migrate with a role that may create tables)",
			"schema", w.cfg.Schema, "missing", strings.Join(missing, ", "))
		down = append(down, downSchema)
	} else if w.cfg.KeyLayout == pgstore.LayoutPartitioned {
		// The layout's state, and its first partitions when it has none.
		if err := w.store.Check(ctx); err != nil {
			log.Warn("worker: the partitioned key table is not ready (its first partitions are created by a role that owns the tables)",
				"schema", w.cfg.Schema, "err", redact.Password(err.Error()))
			down = append(down, downSchema)
		}
	}
	if len(w.cfg.Brokers) == 0 {
		return down // a Pub/Sub of the user's: nothing to ask Kafka
	}
	if name, err := w.checkKafka(ctx, create); err != nil {
		log.Warn("worker: Kafka unavailable", "err", err)
		down = append(down, name)
	}
	return down
}

// singleTableClosed returns ErrSingleTableClosed when the worker is of the
// single table, the schema is found lacking (down), and the table is
// missing because the partitioned layout's clean-up dropped it: no waiting
// brings it back. Only at start-up (waitReady): Health reports the schema
// down.
func (w *Worker) singleTableClosed(ctx context.Context, down []string) error {
	if !slices.Contains(down, downSchema) || w.cfg.KeyLayout != pgstore.LayoutSingleTable {
		return nil
	}
	if err := w.store.Check(ctx); errors.Is(err, pgstore.ErrSingleTableClosed) {
		return err
	}
	return nil
}

// topics are the worker's topics, for the start-up check.
func (w *Worker) topics() []kafkapubsub.TopicSpec {
	specs := []kafkapubsub.TopicSpec{
		{Name: w.cfg.Topic, Partitions: w.cfg.TopicPartitions, ReplicationFactor: w.cfg.ReplicationFactor},
		{Name: w.cfg.DeadLetterTopic, Partitions: 1, ReplicationFactor: w.cfg.ReplicationFactor},
	}
	if w.cfg.OutputTopic != "" {
		specs = append(specs, kafkapubsub.TopicSpec{Name: w.cfg.OutputTopic, Partitions: w.cfg.TopicPartitions, ReplicationFactor: w.cfg.ReplicationFactor})
	}
	return specs
}

// kafkaClient returns a client on connections of its own (a shared
// transport would answer from connections it keeps to brokers it learnt
// of earlier), and the function that closes them.
func (w *Worker) kafkaClient() (*kafka.Client, func()) {
	tr := w.cfg.Security.Transport()
	tr.DialTimeout, tr.IdleTimeout = 3*time.Second, time.Second
	return &kafka.Client{Addr: kafka.TCP(w.cfg.Brokers...), Timeout: 5 * time.Second, Transport: tr}, tr.CloseIdleConnections
}

// checkKafka reaches the brokers on connections of its own (a shared
// transport would answer from connections it keeps to brokers it learnt
// of earlier), and checks or creates the topics.
func (w *Worker) checkKafka(ctx context.Context, create bool) (string, error) {
	specs := w.topics()
	if create {
		if err := kafkapubsub.CreateTopics(ctx, w.cfg.Brokers, w.cfg.Security, specs...); err != nil {
			return downKafka, err
		}
		return "", nil
	}
	c, done := w.kafkaClient()
	defer done()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return downKafka, fmt.Errorf("worker: Kafka at %s: %w", strings.Join(w.cfg.Brokers, ","), err)
	}
	found := map[string]error{}
	for _, t := range md.Topics {
		found[t.Name] = t.Error
	}
	var missing []string
	var errs []error
	for _, n := range names {
		terr, ok := found[n]
		switch {
		case !ok || errors.Is(terr, kafka.UnknownTopicOrPartition):
			missing = append(missing, n)
		case terr != nil:
			errs = append(errs, fmt.Errorf("worker: topic %s: %w", n, terr))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("worker: the topics %s do not exist: create them, or set worker.Config.CreateTopics", strings.Join(missing, ", ")))
	}
	if len(errs) > 0 {
		return downTopics, errors.Join(errs...)
	}
	return "", nil
}

// missingTables lists the tables of exactly and of the handler that the
// schema lacks. It needs no privilege on them.
func (w *Worker) missingTables(ctx context.Context) ([]string, error) {
	want := []string{pgx.Identifier{w.cfg.Schema, w.store.Config().Table}.Sanitize(),
		pgx.Identifier{w.cfg.Schema, "exactly_outbox"}.Sanitize()}
	if !w.cfg.NoPositions && w.cfg.Subscriber == nil {
		want = append(want, pgx.Identifier{w.cfg.Schema, "exactly_positions"}.Sanitize(),
			pgx.Identifier{w.cfg.Schema, "exactly_positions_claims"}.Sanitize())
	}
	if w.registersScope() {
		want = append(want, pgx.Identifier{w.cfg.Schema, "exactly_scopes"}.Sanitize())
	}
	for _, t := range w.cfg.Tables {
		if strings.Contains(t, ".") {
			want = append(want, t)
		} else {
			want = append(want, pgx.Identifier{w.cfg.Schema, t}.Sanitize())
		}
	}
	var missing []string
	err := w.pool.QueryRow(ctx, "SELECT coalesce(array_agg(n) FILTER (WHERE to_regclass(n) IS NULL), '{}') FROM unnest($1::text[]) AS n", want).Scan(&missing)
	if err != nil {
		return nil, fmt.Errorf("worker: check the schema %s: %w", w.cfg.Schema, err)
	}
	return missing, nil
}

package workertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/exactly-go/exactly/embedpg"
	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/migrations"
)

// DatabaseURLEnv and BrokersEnv name the environment variables that point
// the kit at the user's servers: a Postgres URL, and Kafka brokers
// separated by commas.
const (
	DatabaseURLEnv = "TEST_DATABASE_URL"
	BrokersEnv     = "TEST_KAFKA_BROKERS"
)

// Config configures a [Kit]. A nil *Config is the zero Config.
type Config struct {
	// DatabaseURL is the Postgres server the kit makes its schema on; the
	// role needs CREATE on the database. Defaults to $TEST_DATABASE_URL,
	// else a throwaway server (embedpg) started once per test binary.
	DatabaseURL string
	// Brokers are the Kafka brokers the kit makes its topics on. Defaults
	// to $TEST_KAFKA_BROKERS, else an in-process broker (kfake) started
	// once per test binary.
	Brokers []string
	// Setup holds SQL statements run in the kit's schema after exactly's
	// migrations and before the worker starts: the handler's own tables.
	// Unqualified names are in the schema. Defaults to none.
	Setup []string
	// Topic, OutputTopic and DeadLetterTopic are the commands, outputs and
	// dead-letter topics, created by New. Default to names of the test's
	// own ("commands-…", "outputs-…", "dlq-…").
	Topic, OutputTopic, DeadLetterTopic string
	// Group is the consumer group of the first worker ([Kit.Replay] starts
	// the next on a new one). Defaults to a name of the test's own.
	Group string
	// Partitions is the commands topic's partition count (the outputs
	// topic has as many, the dead-letter topic one). Defaults to 3.
	Partitions int
	// Timeout bounds each wait: until caught up, for a worker to stop, for
	// a topic to be read. Defaults to 1 minute.
	Timeout time.Duration
}

// Kit is one test's servers, schema, topics and worker. New makes it;
// its methods fail the test they were made with.
type Kit struct {
	t       testing.TB
	cfg     Config
	schema  string
	url     string
	pool    *pgxpool.Pool
	brokers []string
	// inProcess says the brokers are the kit's in-process one.
	inProcess bool

	mu      sync.Mutex
	group   string
	runner  RunFunc  // what Start or Run was given, for Restart and Replay
	running *running // the worker that runs now; nil when none does
	sent    []Command
}

// New prepares a test's servers: a schema of its own on the Postgres server
// with exactly's migrations and Config.Setup applied, and the commands,
// outputs and dead-letter topics on the brokers. All of it is removed when
// the test ends. No worker runs yet: see [Kit.Start] and [Kit.Run].
func New(t testing.TB, cfg *Config) *Kit {
	t.Helper()
	k := &Kit{t: t}
	if cfg != nil {
		k.cfg = *cfg
	}
	c := &k.cfg
	id := suffix()
	if c.Topic == "" {
		c.Topic = "commands-" + id
	}
	if c.OutputTopic == "" {
		c.OutputTopic = "outputs-" + id
	}
	if c.DeadLetterTopic == "" {
		c.DeadLetterTopic = "dlq-" + id
	}
	if c.Group == "" {
		c.Group = "group-" + id
	}
	if c.Partitions <= 0 {
		c.Partitions = 3
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Minute
	}
	k.group = c.Group
	k.schema = "workertest_" + id
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()

	base, embedded, err := databaseURL(c.DatabaseURL)
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	if k.url, err = withSearchPath(base, k.schema); err != nil {
		t.Fatalf("workertest: Config.DatabaseURL: %v", err)
	}
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("workertest: connect to %s: %v", redact.Password(base), err)
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+k.schema)
	_ = admin.Close(ctx)
	if err != nil {
		t.Fatalf("workertest: create schema %s: %v", k.schema, err)
	}
	t.Cleanup(func() { k.dropSchema(base) })
	pcfg, err := pgxpool.ParseConfig(k.url)
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	pcfg.MaxConns = max(pcfg.MaxConns, 16) // a connection per partition, the relay's, the clean-up's and the test's
	if k.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		t.Fatalf("workertest: %v", err)
	}
	t.Cleanup(k.pool.Close)
	if err := migrations.Migrate(ctx, k.pool, &migrations.Config{Schema: k.schema}); err != nil {
		t.Fatalf("workertest: %v", err)
	}
	for _, stmt := range c.Setup {
		if _, err := k.pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("workertest: Config.Setup: %v\n%s", err, stmt)
		}
	}

	if k.brokers, k.inProcess, err = brokers(c.Brokers); err != nil {
		t.Fatalf("workertest: %v", err)
	}
	topics := map[string]int{c.Topic: c.Partitions, c.OutputTopic: c.Partitions, c.DeadLetterTopic: 1}
	if err := createTopics(ctx, k.brokers, topics); err != nil {
		t.Fatalf("workertest: %v", err)
	}
	t.Cleanup(func() { k.deleteTopics(topics) })
	pgFrom, kafkaFrom := "throwaway server", "in-process broker"
	if !embedded {
		pgFrom = redact.Password(base)
	}
	if !k.inProcess {
		kafkaFrom = strings.Join(k.brokers, ",")
	}
	t.Logf("workertest: schema %s on Postgres (%s), topic %s on Kafka (%s)", k.schema, pgFrom, c.Topic, kafkaFrom)
	return k
}

// Pool is the kit's pool: its search_path is the kit's schema, so the
// handler's unqualified table names are found there.
func (k *Kit) Pool() *pgxpool.Pool { return k.pool }

// Schema is the kit's schema, with exactly's tables and Config.Setup's.
func (k *Kit) Schema() string { return k.schema }

// DatabaseURL is the Postgres URL of the kit's schema (its search_path
// set), for a program that connects on its own.
func (k *Kit) DatabaseURL() string { return k.url }

// Brokers are the Kafka brokers.
func (k *Kit) Brokers() []string { return k.brokers }

// Topic is the commands topic.
func (k *Kit) Topic() string { return k.cfg.Topic }

// OutputTopic is the topic of the handler's outputs.
func (k *Kit) OutputTopic() string { return k.cfg.OutputTopic }

// DeadLetterTopic is the dead-letter topic.
func (k *Kit) DeadLetterTopic() string { return k.cfg.DeadLetterTopic }

// Group is the consumer group of the worker that runs now (or ran last).
func (k *Kit) Group() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.group
}

func (k *Kit) dropSchema(url string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		k.t.Errorf("workertest: drop schema %s: %v", k.schema, err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP SCHEMA "+k.schema+" CASCADE"); err != nil {
		k.t.Errorf("workertest: drop schema %s: %v", k.schema, err)
	}
}

func (k *Kit) deleteTopics(topics map[string]int) {
	if k.inProcess {
		return // the in-process broker goes with the test binary
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var names []string
	for n := range topics {
		names = append(names, n)
	}
	c := &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
	_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: names})
}

// shared holds the servers the kit starts, once per test binary.
var shared struct {
	pgOnce, kafkaOnce sync.Once
	pg                *embedpg.Server
	pgErr, kafkaErr   error
	kafka             *kfake.Cluster
}

func databaseURL(given string) (url string, embedded bool, err error) {
	if given != "" {
		return given, false, nil
	}
	if u := os.Getenv(DatabaseURLEnv); u != "" {
		return u, false, nil
	}
	shared.pgOnce.Do(func() {
		// The server outlives the test that started it. The kernel stops it
		// when the test binary exits (embedpg); Main removes its directory
		// too.
		shared.pg, shared.pgErr = embedpg.Start(context.Background(), nil)
	})
	if shared.pgErr != nil {
		return "", false, fmt.Errorf("no %s and no throwaway PostgreSQL (set %s to a server the tests may create schemas on): %w",
			DatabaseURLEnv, DatabaseURLEnv, shared.pgErr)
	}
	return shared.pg.URL(), true, nil
}

func brokers(given []string) (addrs []string, inProcess bool, err error) {
	if len(given) > 0 {
		return given, false, nil
	}
	if v := os.Getenv(BrokersEnv); v != "" {
		return strings.Split(v, ","), false, nil
	}
	shared.kafkaOnce.Do(func() {
		shared.kafka, shared.kafkaErr = kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	})
	if shared.kafkaErr != nil {
		return nil, false, fmt.Errorf("no %s and no in-process broker: %w", BrokersEnv, shared.kafkaErr)
	}
	return shared.kafka.ListenAddrs(), true, nil
}

// Main runs the tests of a package (call it from TestMain) and then stops
// the servers the kit started: without it, the throwaway PostgreSQL is
// stopped when the test binary exits, and its directory is left in the
// temporary directory.
func Main(m *testing.M) {
	code := m.Run()
	if shared.pg != nil {
		_ = shared.pg.Stop()
	}
	if shared.kafka != nil {
		shared.kafka.Close()
	}
	os.Exit(code)
}

func createTopics(ctx context.Context, brokers []string, topics map[string]int) error {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	var req kafka.CreateTopicsRequest
	for name, n := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: name, NumPartitions: n, ReplicationFactor: 1})
	}
	res, err := c.CreateTopics(ctx, &req)
	if err != nil {
		return fmt.Errorf("create topics on %v: %w", brokers, err)
	}
	for name, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
	}
	// A new partition's leader may not serve it at once.
	for name, n := range topics {
		for {
			if _, err := endOffsets(ctx, c, name, n); err == nil {
				break
			} else if ctx.Err() != nil {
				return fmt.Errorf("topic %s does not serve: %w", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func withSearchPath(u, schema string) (string, error) {
	if _, err := pgx.ParseConfig(u); err != nil {
		return "", errors.New(redact.Password(err.Error()))
	}
	if !strings.Contains(u, "://") {
		return u + " search_path=" + schema, nil // the key=value form
	}
	parsed, err := neturl.Parse(u)
	if err != nil {
		return "", errors.New(redact.Password(err.Error()))
	}
	q := parsed.Query()
	q.Set("search_path", schema)
	parsed.RawQuery = q.Encode()
	return parsed.String(), nil
}

func suffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

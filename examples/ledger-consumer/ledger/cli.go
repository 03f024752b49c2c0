package ledger

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/kgopubsub"
	"github.com/exactly-go/exactly/migrations"
	"github.com/exactly-go/exactly/pgstore"
	"github.com/exactly-go/exactly/worker"
)

const usage = `ledger-consumer: the reference ledger worker of exactly.

Usage:
  ledger-consumer demo     migrate, produce a workload with duplicates and bad input,
                           consume it, verify the balances (in-process Kafka unless
                           KAFKA_BROKERS is set)
  ledger-consumer migrate  create or upgrade the worker's tables (a role with DDL rights)
  ledger-consumer worker   consume the commands topic until SIGINT/SIGTERM (no DDL
                           unless --migrate)
  ledger-consumer load     produce a workload to the commands topic
  ledger-consumer verify   recompute the balances from the commands topic and compare

Environment: DATABASE_URL (default ` + DefaultDatabaseURL + `), KAFKA_BROKERS (comma-separated).
Run "ledger-consumer COMMAND -h" for a command's flags.
`

// Main runs the command line; it returns the process exit code: 0, 1 on
// failure (or balances that differ), 2 on a usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	cmd := args[0]
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fs := flag.NewFlagSet("ledger-consumer "+cmd, flag.ContinueOnError)
	dbURL := func() *string {
		return fs.String("database-url", envOr("DATABASE_URL", DefaultDatabaseURL), "Postgres URL (default $DATABASE_URL)")
	}
	brokers := func() *string {
		return fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated (default $KAFKA_BROKERS)")
	}
	schema := func() *string {
		return fs.String("schema", "ledger", "Postgres schema of the ledger's and exactly's tables")
	}
	commands := func() *string { return fs.String("commands", "ledger.commands", "commands topic") }
	load := DefaultLoad()
	loadFlags := func() {
		fs.IntVar(&load.Commands, "n", load.Commands, "distinct commands, 1 or more")
		fs.IntVar(&load.Accounts, "accounts", load.Accounts, "accounts, 1 or more")
		fs.Float64Var(&load.Duplicates, "duplicates", load.Duplicates, "share of extra records that repeat a command, 0 (none) to 1")
		fs.Float64Var(&load.KeyReuse, "key-reuse", load.KeyReuse, "share of extra records that reuse a command_id with another payload, 0 to 1")
		fs.Float64Var(&load.Malformed, "malformed", load.Malformed, "share of extra records that are not commands, 0 to 1")
		fs.Uint64Var(&load.Seed, "seed", 0, "seed of the workload (0: the current time)")
	}
	var (
		url, bs, sch, cmds, events, dlq, group, metricsAddr *string
		noDedupe, replay, migrate, withConsole              *bool
		batch                                               *int
		sessionTimeout                                      *time.Duration
		keyLayout, keyCleanup                               *string
		transport, groupProtocol, instanceID                *string
		kconn                                               kafkaConn
	)
	switch cmd {
	case "demo":
		url, bs = dbURL(), brokers()
		loadFlags()
		replay = fs.Bool("replay", true, "consume the topic a second time with a new group after the first pass")
		noDedupe = fs.Bool("no-dedupe", false, "run without the dedupe middleware (to measure it, or to watch verify fail)")
		batch = fs.Int("batch", 500, "consume the topic once more in batch mode, batches of up to this many commands, into a schema of its own, and report both modes (0: per-message mode only)")
	case "migrate":
		url, sch = dbURL(), schema()
	case "worker":
		url, bs, sch, cmds = dbURL(), brokers(), schema(), commands()
		events = fs.String("events", "ledger.events", "events topic (the outbox publishes here)")
		dlq = fs.String("dead-letter", "ledger.dlq", "dead-letter topic (malformed commands, key reuse)")
		group = fs.String("group", "ledger-consumer", "consumer group")
		sessionTimeout = fs.Duration("session-timeout", 10*time.Second, "how long the group waits for a silent member before its partitions move (a crashed worker's partitions wait this long); the broker's group.min.session.timeout.ms (6s by default) is the floor")
		metricsAddr = fs.String("metrics-addr", "127.0.0.1:9090", "address for /metrics and /healthz (\":9090\" for every interface; \"\" for none)")
		withConsole = fs.Bool("console", false, "serve the operator console at /console/ on --metrics-addr (docs/console.md); its redrive action needs the token in $CONSOLE_TOKEN, read-only without it")
		migrate = fs.Bool("migrate", false, "create or upgrade the tables before consuming (needs DDL rights; production runs `migrate` once instead)")
		noDedupe = fs.Bool("no-dedupe", false, "run without the dedupe middleware (to measure it, or to watch verify fail)")
		batch = fs.Int("batch", 0, "batch mode: apply up to this many commands per transaction, set-based (0: one transaction per command)")
		keyLayout = fs.String("key-layout", "partitioned", "how the keys are kept: partitioned (time partitions; the worker's role must own the tables, see docs/keys.md) or single-table (one table, for a deployment that has not switched)")
		keyCleanup = fs.String("key-cleanup", "1m", "how often the key clean-up runs (with --key-layout partitioned it also creates the partitions ahead), at least 1ms; off: another process of the tables' owner runs it")
		transport = fs.String("transport", "kafka-go", "the Kafka client: kafka-go, or franz-go (rebalances that stop only the partitions that move, static members, an idempotent producer; see docs/transports.md)")
		groupProtocol = fs.String("group-protocol", "classic", "with --transport franz-go: classic (cooperative-sticky) or consumer (KIP-848, Kafka 4.0 and later; the broker's session timeout and heartbeat interval apply, not --session-timeout)")
		instanceID = fs.String("instance-id", "", "with --transport franz-go: a static member's ID (group.instance.id), one per running worker (a pod's name): a restart within --session-timeout moves no partition")
		kconn.register(fs)
	case "load":
		bs, cmds = brokers(), commands()
		loadFlags()
	case "verify":
		url, bs, sch, cmds = dbURL(), brokers(), schema(), commands()
	default:
		fmt.Fprintf(stderr, "ledger-consumer: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	// The demo's HTTP API.
	var apiAddr *string
	if cmd == "demo" {
		apiAddr = fs.String("api-addr", "127.0.0.1:0", "serve the ledger's HTTP API here and post the commands to it with retries (port 0: an ephemeral port; off: produce every record to Kafka directly)")
	}
	// Help asked for goes to stdout; a flag error and the usage to stderr.
	var flagOut bytes.Buffer
	fs.SetOutput(&flagOut)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stdout.Write(flagOut.Bytes())
			return 0
		}
		_, _ = stderr.Write(flagOut.Bytes())
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ledger-consumer %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "ledger-consumer:", err)
		return 1
	}
	var brokerList []string
	if bs != nil && *bs != "" {
		brokerList = strings.Split(*bs, ",")
	}
	if cmd == "demo" || cmd == "load" {
		if err := load.Validate(); err != nil {
			fmt.Fprintf(stderr, "ledger-consumer %s: %v\n", cmd, strings.TrimPrefix(err.Error(), "ledger: "))
			return 2
		}
	}
	if cmd == "demo" {
		fmt.Fprintln(stderr, "ledger demo: producing", load.Commands, "commands over", load.Accounts, "accounts …")
		sum, err := Demo(ctx, DemoConfig{DatabaseURL: *url, Brokers: brokerList, Load: load, Progress: stderr, NoDedupe: *noDedupe, Replay: *replay, Batch: *batch, Logger: slog.New(slog.DiscardHandler),
			APIAddr: *apiAddr})
		if err != nil {
			return fail(err)
		}
		sum.Print(stdout)
		if !sum.Match() {
			return 1
		}
		return 0
	}
	if bs != nil && len(brokerList) == 0 {
		fmt.Fprintf(stderr, "ledger-consumer %s: set KAFKA_BROKERS or --brokers\n", cmd)
		return 2
	}
	if cmd == "load" {
		wl, err := Generate(load)
		if err != nil {
			return fail(err)
		}
		if err := createTopics(ctx, brokerList, map[string]int{*cmds: 6}); err != nil {
			return fail(err)
		}
		if err := Produce(ctx, brokerList, *cmds, wl.Records); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "produced %d records: %d commands, %d duplicates, %d key reuses, %d malformed\n",
			len(wl.Records), wl.Unique, wl.Duplicates, wl.KeyReused, wl.Malformed)
		return 0
	}
	if cmd == "worker" {
		layout, err := parseKeyLayout(*keyLayout)
		if err != nil {
			fmt.Fprintf(stderr, "ledger-consumer worker: %v\n", err)
			return 2
		}
		cleanup := time.Duration(-1) // off
		if *keyCleanup != "off" {
			if cleanup, err = time.ParseDuration(*keyCleanup); err != nil || cleanup < time.Millisecond {
				fmt.Fprintf(stderr, "ledger-consumer worker: --key-cleanup is %q: set a duration of 1ms or more, or off\n", *keyCleanup)
				return 2
			}
		}
		// The worker waits for Postgres and Kafka itself, so its pool is
		// made without connecting.
		pool, err := newPool(ctx, *url)
		if err != nil {
			return fail(err)
		}
		defer pool.Close()
		if *migrate {
			// Waits for Postgres like the worker; a migration that fails on
			// a reachable database is an error. A failed connection is
			// waited on even when Postgres answers by the time it is
			// checked again.
			for wait := 100 * time.Millisecond; ; wait = min(2*wait, 10*time.Second) {
				err := Migrate(ctx, pool, *sch, logger)
				if err == nil {
					break
				}
				var connErr *pgconn.ConnectError
				if ctx.Err() != nil || (!errors.As(err, &connErr) && pool.Ping(ctx) == nil) {
					return fail(err)
				}
				logger.Warn("ledger: waiting for Postgres to migrate", "err", err, "retry_in", wait)
				select {
				case <-ctx.Done():
					return 0
				case <-time.After(wait):
				}
			}
		}
		sec, part, err := kconn.settings()
		if err != nil {
			fmt.Fprintf(stderr, "ledger-consumer worker: %v\n", err)
			return 2
		}
		tr, err := parseTransport(*transport, *groupProtocol, *instanceID)
		if err != nil {
			fmt.Fprintf(stderr, "ledger-consumer worker: %v\n", err)
			return 2
		}
		var con *console.Config
		if *withConsole {
			con = &console.Config{Token: os.Getenv("CONSOLE_TOKEN")}
		}
		w, err := NewWorker(pool, Config{Console: con, Schema: *sch, Brokers: brokerList, Security: sec, Partitioner: part, Commands: *cmds, Events: *events, DeadLetter: *dlq,
			Group: *group, SessionTimeout: *sessionTimeout, MetricsAddr: *metricsAddr, CreateTopics: true, NoDedupe: *noDedupe, Batch: *batch,
			KeyLayout: layout, CleanupInterval: cleanup, Transport: tr, Logger: logger})
		if err != nil {
			return fail(err)
		}
		if err := w.Run(ctx); err != nil {
			return fail(err)
		}
		return 0
	}
	pool, err := connect(ctx, *url)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	if cmd == "migrate" {
		if err := Migrate(ctx, pool, *sch, logger); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "schema %s is up to date\n", *sch)
		return 0
	}
	// verify
	rep, err := Verify(ctx, pool, *sch, brokerList, *cmds)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "records %d: %d unique commands, %d duplicates, %d key reuses, %d malformed; %d accounts; balances match: %v\n",
		rep.Records, rep.Unique, rep.Duplicates, rep.KeyReused, rep.Malformed, rep.Accounts, rep.Match())
	for _, m := range rep.Mismatches {
		fmt.Fprintln(stdout, "mismatch:", m)
	}
	if !rep.Match() {
		return 1
	}
	return 0
}

// Migrate creates or upgrades exactly's tables and the ledger's in schema,
// and the partitioned key layout's first partitions: the step that needs
// DDL rights, run once per deploy by a role that has them, so that the
// worker's own role needs none. It does not start the partitioned layout
// (a worker does, at its first claim): workers kept on the single table
// go on claiming there.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) error {
	if err := migrations.Migrate(ctx, pool, &migrations.Config{Schema: schema, Logger: logger}); err != nil {
		return err
	}
	if err := Setup(ctx, pool, schema); err != nil {
		return err
	}
	keys, err := pgstore.New(pool, &pgstore.Config{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}
	if _, err := keys.Cleanup(ctx, &dedupe.CleanupConfig{MaxBatches: 1}); err != nil && !errors.Is(err, dedupe.ErrCleanupBusy) {
		return fmt.Errorf("create the key partitions: %w", err)
	}
	return nil
}

// parseTransport reads --transport, --group-protocol and --instance-id:
// nil for kafka-go, the worker's default.
func parseTransport(name, protocol, instanceID string) (worker.Transport, error) {
	switch name {
	case "kafka-go":
		if protocol != "classic" || instanceID != "" {
			return nil, errors.New("--group-protocol and --instance-id are franz-go's: add --transport franz-go, or leave them out")
		}
		return nil, nil
	case "franz-go":
	default:
		return nil, fmt.Errorf("--transport is %q: use kafka-go or franz-go", name)
	}
	t := kgopubsub.Transport{InstanceID: instanceID}
	switch protocol {
	case "classic":
		t.GroupProtocol = kgopubsub.ProtocolClassic
	case "consumer":
		if instanceID != "" {
			return nil, errors.New("--instance-id with --group-protocol consumer: a static member's restart under KIP-848 waits out the broker's session timeout (45s by default); use --group-protocol classic for static members")
		}
		t.GroupProtocol = kgopubsub.ProtocolConsumer
	default:
		return nil, fmt.Errorf("--group-protocol is %q: use classic or consumer", protocol)
	}
	return t, nil
}

// parseKeyLayout reads --key-layout.
func parseKeyLayout(s string) (pgstore.Layout, error) {
	for _, l := range []pgstore.Layout{pgstore.LayoutPartitioned, pgstore.LayoutSingleTable} {
		if s == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("--key-layout is %q: set it to partitioned or single-table", s)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// register adds the Kafka connection flags to fs (kafkaconn.go).
func (k *kafkaConn) register(fs *flag.FlagSet) {
	env := os.Getenv
	fs.BoolVar(&k.tls, "kafka-tls", env("KAFKA_TLS") == "true", "connect to Kafka over TLS (default $KAFKA_TLS=true)")
	fs.StringVar(&k.ca, "kafka-tls-ca", env("KAFKA_TLS_CA"), "PEM file of the CAs that sign the brokers' certificates (default the system's; $KAFKA_TLS_CA)")
	fs.StringVar(&k.cert, "kafka-tls-cert", env("KAFKA_TLS_CERT"), "client certificate, PEM, for mutual TLS ($KAFKA_TLS_CERT)")
	fs.StringVar(&k.key, "kafka-tls-key", env("KAFKA_TLS_KEY"), "client key, PEM, for mutual TLS ($KAFKA_TLS_KEY)")
	fs.BoolVar(&k.insecure, "kafka-tls-insecure-skip-verify", false, "do not verify the brokers' certificates (tests only)")
	fs.StringVar(&k.mechanism, "kafka-sasl", env("KAFKA_SASL_MECHANISM"), "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (default none; $KAFKA_SASL_MECHANISM); the password comes from $KAFKA_SASL_PASSWORD")
	fs.StringVar(&k.user, "kafka-sasl-user", env("KAFKA_SASL_USER"), "SASL user name ($KAFKA_SASL_USER)")
	fs.StringVar(&k.parts, "partitioner", env("KAFKA_PARTITIONER"), "how published records are spread over partitions by key: murmur2 (Java, franz-go; the default), fnv1a (sarama, watermill-kafka) or crc32 (librdkafka); match the topic's other producers ($KAFKA_PARTITIONER)")
}

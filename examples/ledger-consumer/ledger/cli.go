package ledger

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/exactly-go/exactly/migrations"
)

const usage = `ledger-consumer: the reference ledger worker of exactly.

Usage:
  ledger-consumer demo     migrate, produce a workload with duplicates and bad input,
                           consume it, verify the balances (in-process Kafka unless
                           KAFKA_BROKERS is set)
  ledger-consumer worker   consume ledger.commands until SIGINT/SIGTERM
  ledger-consumer load     produce a workload to ledger.commands
  ledger-consumer verify   recompute the balances from ledger.commands and compare

Environment: DATABASE_URL (default ` + DefaultDatabaseURL + `), KAFKA_BROKERS (comma-separated).
Run "ledger-consumer COMMAND -h" for a command's flags.
`

// Main runs the command line; it returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", envOr("DATABASE_URL", DefaultDatabaseURL), "Postgres URL")
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated")
	schema := fs.String("schema", "ledger", "Postgres schema")
	commands := fs.String("commands", "ledger.commands", "commands topic")
	var load LoadConfig
	fs.IntVar(&load.Commands, "n", 2000, "distinct commands (demo, load)")
	fs.IntVar(&load.Accounts, "accounts", 50, "accounts (demo, load)")
	fs.Float64Var(&load.Duplicates, "duplicates", 0.10, "share of duplicate records (demo, load)")
	fs.Float64Var(&load.KeyReuse, "key-reuse", 0.02, "share of key-reuse records (demo, load)")
	fs.Float64Var(&load.Malformed, "malformed", 0.02, "share of malformed records (demo, load)")
	metricsAddr := fs.String("metrics-addr", ":9090", "address for /metrics and /healthz (worker)")
	replay := fs.Bool("replay", true, "consume the topic a second time with a new group after the first pass (demo)")
	noDedupe := fs.Bool("no-dedupe", false, "run without the dedupe middleware (to measure it, or to watch verify fail)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var bs []string
	if *brokers != "" {
		bs = strings.Split(*brokers, ",")
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "ledger-consumer:", err)
		return 1
	}
	switch args[0] {
	case "demo":
		fmt.Fprintln(stderr, "ledger demo: producing", load.Commands, "commands over", load.Accounts, "accounts …")
		sum, err := Demo(ctx, DemoConfig{DatabaseURL: *dbURL, Brokers: bs, Load: load, Progress: stderr, NoDedupe: *noDedupe, Replay: *replay, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return fail(err)
		}
		sum.Print(stdout)
		if !sum.Match() {
			return 1
		}
		return 0
	case "worker", "load", "verify":
		if len(bs) == 0 {
			return fail(errors.New("set KAFKA_BROKERS or --brokers"))
		}
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	pool, err := connect(ctx, *dbURL)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	switch args[0] {
	case "worker":
		if err := migrations.Migrate(ctx, pool, &migrations.Opts{Schema: *schema, Logger: logger}); err != nil {
			return fail(err)
		}
		if err := Setup(ctx, pool, *schema); err != nil {
			return fail(err)
		}
		if err := createTopics(ctx, bs, map[string]int{*commands: 6, "ledger.events": 3, "ledger.dlq": 1}); err != nil {
			return fail(err)
		}
		w, err := NewWorker(pool, Config{Schema: *schema, Brokers: bs, Commands: *commands, MetricsAddr: *metricsAddr, NoDedupe: *noDedupe, Logger: logger})
		if err != nil {
			return fail(err)
		}
		if err := w.Run(ctx); err != nil {
			return fail(err)
		}
		return 0
	case "load":
		if err := createTopics(ctx, bs, map[string]int{*commands: 6}); err != nil {
			return fail(err)
		}
		wl := Generate(load)
		if err := Produce(ctx, bs, *commands, wl.Records); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "produced %d records: %d commands, %d duplicates, %d key reuses, %d malformed\n",
			len(wl.Records), wl.Unique, wl.Duplicates, wl.KeyReused, wl.Malformed)
		return 0
	default: // verify
		rep, err := Verify(ctx, pool, *schema, bs, *commands)
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
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

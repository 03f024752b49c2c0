// Package replaycli is the replay tool: it redelivers Kafka topics and
// proves that their consumers deduplicate. cmd/replay is a thin main over it.
package replaycli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/exactly-go/exactly/console"
	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/kafkaflags"
	"github.com/exactly-go/exactly/internal/redact"
)

// Exit codes.
const (
	ExitOK           = 0
	ExitDoubleApply  = 1 // verify: something was applied twice
	ExitUsage        = 2
	ExitKafka        = 3 // broker unreachable or failing
	ExitDatabase     = 4
	ExitChecksum     = 5
	ExitEmptyRange   = 6
	ExitGroupActive  = 7
	ExitUnknownTopic = 8
	ExitUnknownGroup = 9
	ExitTimeout      = 10
)

const usage = `replay: redeliver Kafka topics and prove that consumers deduplicate.

Commands:
  replay copy    re-publish a range of a topic into another (keys, headers but a share
                 group's copy headers, and per-partition order kept); into the source topic
                 itself only with --into-source
  replay rewind  reset an inactive consumer group's offsets (dry run unless --execute)
  replay verify  wait for the consumer to catch up, snapshot, redeliver, wait, snapshot,
                 report; exit 1 on any double application
  replay redrive list a dead-letter topic's records with their reasons (filter by reason, key,
                 message ID, time); with --execute publish them back to their source topic as
                 they arrived (same key, headers and message ID), once: recorded in the
                 database's exactly_redrives
  replay positions  per partition, the group's committed offset in Kafka, its position kept in
                 the database (pgstore.Positions) and the gap: what a database that lost
                 commits (a failover, a restore) gets delivered again
  replay console serve the operator console (package console): per partition Kafka's
                 committed offset, the database position, the lag and the gap; the outbox; the
                 recent dead letters with a redrive action; a key lookup (docs/console.md)
  replay rebuild in one transaction, empty a scope's tables (--truncate), delete its keys and
                 record a new group as the scope's; that group's workers then apply the
                 topic again from its start, once (dry run unless --execute; docs/rebuild.md)

Examples:
  # redeliver all of ledger.commands into itself, twice, and see nothing move
  replay verify --brokers localhost:9092 --topic ledger.commands --group ledger-consumer \
      --scope ledger-consumer --schema ledger \
      --checksum-sql 'SELECT id, available, held FROM ledger.accounts ORDER BY id' --duplicate 2

  # a consumer keyed by a JSON field, with JSON fingerprints: tell verify the same
  replay verify ... --key field:command_id --fingerprint json

  # same UUIDs with changed payloads: the consumer must report key reuse and apply nothing
  replay verify ... --mutate

  # copy yesterday's records of partition 3 into a scratch topic, dry run first
  replay copy --brokers localhost:9092 --from ledger.commands --to scratch --partition 3 \
      --from-time 2026-11-28T00:00:00Z --to-time 2026-11-29T00:00:00Z --dry-run

  # redeliver partition 3 to the topic's own consumers
  replay copy --brokers localhost:9092 --from ledger.commands --to ledger.commands --into-source --partition 3

  # after a failover or a restore: how far the database is behind Kafka
  replay positions --brokers localhost:9092 --group ledger-consumer --topic ledger.commands \
      --database-url "$DATABASE_URL" --schema ledger

  # the dead letters of a worker, then redrive those a fixed handler now accepts
  replay redrive --brokers localhost:9092 --dlq ledger.commands.dlq --database-url "$DATABASE_URL"
  replay redrive ... --reason 'unknown account' --from-time 2026-11-28T00:00:00Z --execute
  # rebuild the accounts table: empty it, retire the scope's keys, hand the scope to a new
  # group; then start the workers with that group (worker.Config.Group)
  replay rebuild --brokers localhost:9092 --database-url "$DATABASE_URL" --schema ledger \
      --scope ledger-consumer --topic ledger.commands --group ledger-rebuild-1 --truncate accounts,holds
  replay rebuild ... --execute

  # show, then apply, a rewind of a stopped group by 1000 records per partition
  replay rewind --brokers localhost:9092 --group ledger-consumer --topic ledger.commands --back 1000
  replay rewind ... --back 1000 --execute

  # the operator console on 127.0.0.1:8080, its redrive action behind a token
  CONSOLE_TOKEN=... replay console --brokers localhost:9092 --database-url "$DATABASE_URL" \
      --group ledger-consumer --topic ledger.commands --dlq ledger.commands.dlq --scope ledger-consumer

Environment: KAFKA_BROKERS for --brokers, DATABASE_URL for --database-url,
CONSOLE_TOKEN for --token.
Exit codes: 0 ok, 1 double application, 2 usage, 3 Kafka, 4 database, 5 checksum query,
6 empty range, 7 group active, 8 unknown topic, 9 unknown group, 10 consumer did not catch up.
Run "replay COMMAND -h" for a command's flags.
`

// Main runs the tool and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	cmd := args[0]
	fs := flag.NewFlagSet("replay "+cmd, flag.ContinueOnError)
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated (default $KAFKA_BROKERS)")
	asJSON := fs.Bool("json", false, "print the report as JSON (for CI)")
	var kflags kafkaflags.Flags
	kflags.Register(fs)
	var (
		from, to, topic, group, dbURL, sql, scope, schema, table string
		partition                                                int
		fromOff, toOff, toOffset, back                           int64
		fromTime, toTime, atTime, keyFlag, fpFlag                string
		dup                                                      int
		mutateP, dry, execute, intoSource, force                 bool
		dlq, reason, letterKey, letterID                         string
		addr, token, trusted, httpScope, layout                  string
		ttl, timeout                                             time.Duration
	)
	rangeFlags := func() {
		fs.IntVar(&partition, "partition", -1, "only this partition (default all)")
		fs.Int64Var(&fromOff, "from-offset", -1, "first offset (default the log start)")
		fs.Int64Var(&toOff, "to-offset", -1, "end offset, exclusive (default the log end)")
		fs.StringVar(&fromTime, "from-time", "", "first record time, RFC 3339")
		fs.StringVar(&toTime, "to-time", "", "end record time, RFC 3339, exclusive")
		fs.IntVar(&dup, "duplicate", 1, "write each record N times")
		fs.BoolVar(&mutateP, "mutate", false, "change each payload, keep its UUID (the consumer must report key reuse)")
	}
	switch cmd {
	case "copy":
		fs.StringVar(&from, "from", "", "source topic (required)")
		fs.StringVar(&to, "to", "", "target topic (required)")
		fs.BoolVar(&intoSource, "into-source", false, "allow --to to be the source topic: its consumers get the records again")
		rangeFlags()
		fs.BoolVar(&dry, "dry-run", false, "show what would be written; write nothing")
	case "rewind":
		fs.StringVar(&group, "group", "", "consumer group (required)")
		fs.StringVar(&topic, "topic", "", "topic (required)")
		fs.Int64Var(&toOffset, "to-offset", -1, "set every partition to this offset")
		fs.StringVar(&atTime, "to-time", "", "set each partition to its first record at or after this time, RFC 3339")
		fs.Int64Var(&back, "back", 0, "move each partition back by N records")
		fs.BoolVar(&execute, "execute", false, "commit the new offsets (default: show the plan only)")
	case "verify":
		fs.StringVar(&topic, "topic", "", "the consumer's topic (required)")
		fs.StringVar(&group, "group", "", "the consumer's group (required)")
		fs.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
		fs.StringVar(&sql, "checksum-sql", "", "query over the state that must not change (required)")
		fs.StringVar(&scope, "scope", "", "dedupe scope of the consumer (its handler name) to classify keys")
		fs.StringVar(&schema, "schema", "", "schema of the dedupe table (default: the database URL's search_path, else public)")
		fs.StringVar(&table, "table", "", "the key table of a consumer on pgstore.LayoutSingleTable with a table of its own (default: the schema's keys, either layout)")
		fs.StringVar(&keyFlag, "key", "uuid", "the consumer's key: uuid (the message UUID), metadata:NAME (a header) or field:PATH (a JSON field, dot-separated)")
		fs.StringVar(&fpFlag, "fingerprint", "raw", "the consumer's fingerprint: raw (SHA-256 of the bytes) or json (of the canonical JSON)")
		fs.DurationVar(&ttl, "ttl", 7*24*time.Hour, "the consumer's key TTL")
		fs.DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the consumer to catch up")
		rangeFlags()
	case "redrive":
		fs.StringVar(&dlq, "dlq", "", "the dead-letter topic (required)")
		fs.StringVar(&to, "to", "", "publish to this topic (default: each record's source, its topic_poisoned header)")
		fs.StringVar(&reason, "reason", "", "only the records whose reason contains this text")
		fs.StringVar(&letterKey, "key", "", "only the records with this Kafka key")
		fs.StringVar(&letterID, "id", "", "only the records with this message ID")
		fs.IntVar(&partition, "partition", -1, "only this partition of the dead-letter topic (default all)")
		fs.Int64Var(&fromOff, "from-offset", -1, "first offset (default the log start)")
		fs.Int64Var(&toOff, "to-offset", -1, "end offset, exclusive (default the log end)")
		fs.StringVar(&fromTime, "from-time", "", "first dead-letter time, RFC 3339")
		fs.StringVar(&toTime, "to-time", "", "end dead-letter time, RFC 3339, exclusive")
		fs.BoolVar(&execute, "execute", false, "publish the selected records not redriven yet (default: list only)")
		fs.BoolVar(&force, "force", false, "with --execute, publish again the records whose earlier redrive failed and may have been published (uncertain)")
		fs.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL whose exactly_redrives records the redrives (default $DATABASE_URL; required with --execute)")
		fs.StringVar(&schema, "schema", "", "schema of exactly_redrives (default: the database URL's search_path, else public)")
	case "positions":
		fs.StringVar(&group, "group", "", "consumer group (required)")
		fs.StringVar(&topic, "topic", "", "topic (required)")
		fs.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
		fs.StringVar(&schema, "schema", "", "schema of the positions table (default: the database URL's search_path, else public)")
		fs.StringVar(&table, "table", "exactly_positions", "positions table")
	case "rebuild":
		fs.StringVar(&scope, "scope", "", "the consumer's scope (worker.Config.Scope; required)")
		fs.StringVar(&topic, "topic", "", "the consumer's topic (required)")
		fs.StringVar(&group, "group", "", "the consumer group that rebuilds, with no committed offset on the topic (required)")
		fs.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL)")
		fs.StringVar(&schema, "schema", "", "schema of exactly's tables (default: the database URL's search_path, else public)")
		fs.StringVar(&table, "truncate", "", "the handler's tables to empty in the same transaction, comma-separated (schema.table, or in --schema)")
		fs.BoolVar(&execute, "execute", false, "commit (default: count the keys in a transaction rolled back, truncate nothing)")
	case "console":
		fs.StringVar(&group, "group", "", "the worker's consumer group (its committed offsets and positions)")
		fs.StringVar(&topic, "topic", "", "the worker's topics, comma-separated")
		fs.StringVar(&dlq, "dlq", "", "the dead-letter topic (its recent records, with a redrive action)")
		fs.StringVar(&dbURL, "database-url", os.Getenv("DATABASE_URL"), "the worker's Postgres URL (default $DATABASE_URL; required)")
		fs.StringVar(&schema, "schema", "", "schema of exactly's tables (default: the database URL's search_path, else public)")
		fs.StringVar(&scope, "scope", "", "the consumer's scope, offered in the key lookup")
		fs.StringVar(&httpScope, "http-scope", "http", "httpkey.Config.Scope of the HTTP keys in the key lookup")
		fs.StringVar(&layout, "key-layout", "partitioned", "the key table's layout: partitioned or single")
		fs.StringVar(&addr, "addr", "127.0.0.1:8080", "address to serve the page on")
		fs.StringVar(&token, "token", os.Getenv("CONSOLE_TOKEN"), "the token that the page's actions need (default $CONSOLE_TOKEN; none: read-only unless --trusted-header)")
		fs.StringVar(&trusted, "trusted-header", "", "a header that a trusted proxy in front sets on authenticated requests (and strips from others): those may take actions")
	default:
		fmt.Fprintf(stderr, "replay: unknown command %q\n\n%s", cmd, usage)
		return ExitUsage
	}
	// Help asked for goes to stdout; a flag error and the usage to stderr.
	var flagOut bytes.Buffer
	fs.SetOutput(&flagOut)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stdout.Write(flagOut.Bytes())
			return ExitOK
		}
		_, _ = stderr.Write(flagOut.Bytes())
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "replay %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return ExitUsage
	}
	usageErr := func(msg string) int {
		fmt.Fprintln(stderr, "replay "+cmd+": "+msg)
		return ExitUsage
	}
	if *brokers == "" {
		return usageErr("--brokers (or KAFKA_BROKERS) is required")
	}
	bs := strings.Split(*brokers, ",")
	sec, err := kflags.Security()
	if err != nil {
		return usageErr(err.Error())
	}
	parseTime := func(name, v string) (time.Time, bool) {
		if v == "" {
			return time.Time{}, true
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			fmt.Fprintf(stderr, "replay %s: --%s %q is not an RFC 3339 time\n", cmd, name, v)
			return t, false
		}
		return t, true
	}
	r := Range{Partition: partition, FromOffset: fromOff, ToOffset: toOff}
	var ok bool
	if r.FromTime, ok = parseTime("from-time", fromTime); !ok {
		return ExitUsage
	}
	if r.ToTime, ok = parseTime("to-time", toTime); !ok {
		return ExitUsage
	}
	prog := newProgress(stderr)
	var report any
	pass := true
	switch cmd {
	case "copy":
		if from == "" {
			return usageErr("--from is required")
		}
		report, err = Copy(ctx, CopyConfig{Brokers: bs, Security: sec, From: from, To: to, IntoSource: intoSource, Range: r, Duplicate: dup, Mutate: mutateP, DryRun: dry, Progress: prog})
	case "rewind":
		if group == "" || topic == "" {
			return usageErr("--group and --topic are required")
		}
		at, ok := parseTime("to-time", atTime)
		if !ok {
			return ExitUsage
		}
		report, err = Rewind(ctx, RewindConfig{Brokers: bs, Security: sec, Group: group, Topic: topic, ToOffset: toOffset, ToTime: at, Back: back, Execute: execute})
	case "verify":
		if topic == "" || group == "" || sql == "" || dbURL == "" {
			return usageErr("--topic, --group, --checksum-sql and --database-url (or DATABASE_URL) are required")
		}
		keyFunc, fpFunc, msg := parseKeyFlags(keyFlag, fpFlag)
		if msg != "" {
			return usageErr(msg)
		}
		var rep VerifyReport
		rep, err = Verify(ctx, VerifyConfig{KeyFunc: keyFunc, FingerprintFunc: fpFunc,
			Copy:        CopyConfig{Brokers: bs, Security: sec, From: topic, Range: r, Duplicate: dup, Mutate: mutateP, Progress: prog},
			DatabaseURL: dbURL, Group: group, ChecksumSQL: sql, Scope: scope, Schema: schema, Table: table, TTL: ttl, Timeout: timeout,
			Warn: func(f string, a ...any) { fmt.Fprintf(stderr, "replay verify: warning: "+f+"\n", a...) },
		})
		report, pass = rep, rep.Pass
	case "redrive":
		report, err = Redrive(ctx, RedriveConfig{Brokers: bs, Security: sec, DeadLetterTopic: dlq, Range: r, Reason: reason, Key: letterKey,
			ID: letterID, To: to, Execute: execute, Force: force, DatabaseURL: dbURL, Schema: schema})
	case "rebuild":
		var truncate []string
		if table != "" {
			truncate = strings.Split(table, ",")
		}
		report, err = Rebuild(ctx, RebuildConfig{Brokers: bs, Security: sec, Scope: scope, Topic: topic, Group: group,
			Truncate: truncate, DatabaseURL: dbURL, Schema: schema, Execute: execute})
	case "console":
		kl, ok := keyLayout(layout)
		if !ok {
			return usageErr("--key-layout is " + layout + ": want partitioned or single")
		}
		var topics []string
		if topic != "" {
			topics = strings.Split(topic, ",")
		}
		err = Console(ctx, ConsoleConfig{Brokers: bs, Security: sec, DatabaseURL: dbURL, Addr: addr, Console: console.Config{
			Group: group, Topics: topics, DeadLetterTopic: dlq, Schema: schema, KeyLayout: kl, Scope: scope, HTTPScope: httpScope,
			Token: token, TrustedHeader: trusted}}, stderr)
		if err == nil {
			return ExitOK
		}
	case "positions":
		report, err = Positions(ctx, PositionsConfig{Brokers: bs, Security: sec, Group: group, Topic: topic, DatabaseURL: dbURL, Schema: schema, Table: table})
	}
	if err != nil {
		fmt.Fprintf(stderr, "replay %s: %s\n", cmd, redact.In(err.Error(), dbURL))
		return exitCode(err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(report)
	} else {
		printReport(stdout, report)
	}
	if !pass {
		return ExitDoubleApply
	}
	return ExitOK
}

// parseKeyFlags turns --key and --fingerprint into the consumer's
// functions; a non-empty message is a usage error.
func parseKeyFlags(key, fp string) (consumer.KeyFunc, dedupe.FingerprintFunc, string) {
	var kf consumer.KeyFunc
	switch kind, arg, _ := strings.Cut(key, ":"); {
	case key == "uuid":
		kf = consumer.KeyFromUUID
	case kind == "metadata" && arg != "":
		kf = consumer.KeyFromMetadata(arg)
	case kind == "field" && arg != "":
		kf = consumer.KeyFromJSONField(arg)
	default:
		return nil, nil, fmt.Sprintf("--key %q: use uuid, metadata:NAME or field:PATH, as the consumer's KeyFunc", key)
	}
	switch fp {
	case "raw":
		return kf, dedupe.RawFingerprint, ""
	case "json":
		return kf, dedupe.JSONFingerprint, ""
	}
	return nil, nil, fmt.Sprintf("--fingerprint %q: use raw or json, as the consumer's FingerprintFunc", fp)
}

func exitCode(err error) int {
	switch {
	case errors.Is(err, errEmptyRange):
		return ExitEmptyRange
	case errors.Is(err, errGroupActive):
		return ExitGroupActive
	case errors.Is(err, errUnknownTopic):
		return ExitUnknownTopic
	case errors.Is(err, errUnknownGroup):
		return ExitUnknownGroup
	case errors.Is(err, errChecksum):
		return ExitChecksum
	case errors.Is(err, errDatabase):
		return ExitDatabase
	case errors.Is(err, errTimeout):
		return ExitTimeout
	case errors.Is(err, errUsage):
		return ExitUsage
	}
	return ExitKafka
}

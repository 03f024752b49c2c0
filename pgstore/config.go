package pgstore

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/sqlident"
)

// Config configures a Store. The zero value (or a nil *Config) is usable.
type Config struct {
	// Schema holds the table. Defaults to the first schema of the pool's
	// search_path (set it in the connection string: ?search_path=ledger),
	// else "public", as migrations.Config.Schema does.
	Schema string
	// Layout is how the keys are kept: LayoutPartitioned (compact rows, time
	// partitions dropped whole) or LayoutSingleTable (one table, retired by
	// DELETE; see docs/keys.md and docs/upgrading.md for the switch).
	// Defaults to LayoutPartitioned, whose Cleanup runs DDL: run it as the
	// tables' owner (docs/grants.md).
	Layout Layout
	// Table is the key table's name. Defaults to "exactly_keys2"
	// (LayoutPartitioned) or "exactly_keys" (LayoutSingleTable), the tables that the migrations
	// create.
	Table string
	// PartitionsAhead is how many time partitions (of the width in the
	// layout's state table, a day by default) Cleanup keeps created ahead
	// of the current one, for LayoutPartitioned. An ID minted further ahead
	// is an invalid key. Defaults to 3.
	PartitionsAhead int
	// TTL is how long a completed key is kept. It must outlive every way a
	// message can come back: at least the topic's retention.
	// Defaults to dedupe.DefaultTTL (7 days, Kafka's default retention.ms).
	TTL time.Duration
	// MaxResultBytes bounds a stored result. Defaults to 1 MiB.
	MaxResultBytes int
	// IsoLevel is the isolation level of the transactions that Do and Begin open.
	// Defaults to pgx.ReadCommitted.
	IsoLevel pgx.TxIsoLevel
	// MaxTxAttempts bounds how often Do runs a transaction that failed with a
	// serialisation failure, a deadlock or a lost connection. Defaults to 5.
	MaxTxAttempts int
	// RetryBackoff is Do's first pause between attempts, doubled after each
	// and jittered. Defaults to 10ms.
	RetryBackoff time.Duration
	// Logger receives warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults(pool *pgxpool.Pool) (Config, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.Schema == "" {
		o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
	}
	if o.Table == "" {
		o.Table = "exactly_keys2"
		if o.Layout == LayoutSingleTable {
			o.Table = "exactly_keys"
		}
	}
	if o.PartitionsAhead == 0 {
		o.PartitionsAhead = 3
	}
	if o.TTL == 0 {
		o.TTL = dedupe.DefaultTTL
	}
	if o.MaxResultBytes == 0 {
		o.MaxResultBytes = 1 << 20
	}
	if o.IsoLevel == "" {
		o.IsoLevel = pgx.ReadCommitted
	}
	if o.MaxTxAttempts == 0 {
		o.MaxTxAttempts = 5
	}
	if o.RetryBackoff == 0 {
		o.RetryBackoff = 10 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := sqlident.Check("pgstore: Config.Schema", o.Schema); err != nil {
		return o, err
	}
	if err := sqlident.Check("pgstore: Config.Table", o.Table); err != nil {
		return o, err
	}
	switch {
	case o.Layout != LayoutSingleTable && o.Layout != LayoutPartitioned:
		return o, fmt.Errorf("pgstore: Config.Layout is %v: use pgstore.LayoutPartitioned or pgstore.LayoutSingleTable", o.Layout)
	case o.PartitionsAhead < 0:
		return o, fmt.Errorf("pgstore: Config.PartitionsAhead is %d: set 1 or more, or 0 for the default", o.PartitionsAhead)
	case o.TTL < 0:
		return o, fmt.Errorf("pgstore: Config.TTL is %v: set a positive duration, at least the topic's retention", o.TTL)
	case o.MaxResultBytes < 0:
		return o, fmt.Errorf("pgstore: Config.MaxResultBytes is %d: set a positive size or 0 for the default", o.MaxResultBytes)
	case o.MaxTxAttempts < 0:
		return o, fmt.Errorf("pgstore: Config.MaxTxAttempts is %d: set 1 or more, or 0 for the default", o.MaxTxAttempts)
	case o.RetryBackoff < 0:
		return o, fmt.Errorf("pgstore: Config.RetryBackoff is %v: set a positive duration", o.RetryBackoff)
	}
	switch o.IsoLevel {
	case pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable:
	default:
		return o, fmt.Errorf("pgstore: Config.IsoLevel %q is not supported: use pgx.ReadCommitted, pgx.RepeatableRead or pgx.Serializable", o.IsoLevel)
	}
	return o, nil
}

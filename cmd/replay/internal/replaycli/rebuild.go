package replaycli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/redact"
	"github.com/exactly-go/exactly/internal/sqlident"
	"github.com/exactly-go/exactly/kafkapubsub"
	"github.com/exactly-go/exactly/pgstore"
)

// RebuildConfig configures Rebuild.
type RebuildConfig struct {
	Brokers []string
	// Security holds the TLS and SASL settings. Defaults to plain TCP.
	Security kafkapubsub.Security
	// Scope and Topic are the consumer's (worker.Config.Scope and Topic).
	Scope, Topic string
	// Group is the consumer group that rebuilds: it must have no committed
	// offset on Topic, so that it reads the topic from its start.
	Group string
	// Truncate are the tables the scope's handler writes, emptied in the
	// transaction that retires the keys (schema-qualified, or in Schema).
	Truncate    []string
	DatabaseURL string
	// Schema holds exactly's tables. Defaults to the database URL's
	// search_path, else public.
	Schema string
	// Execute commits; without it the keys are counted in a transaction
	// that is rolled back, and nothing is truncated.
	Execute bool
}

// RebuildReport is what Rebuild did, or would do.
type RebuildReport struct {
	Scope string `json:"scope"`
	Topic string `json:"topic"`
	Group string `json:"group"`
	// PreviousGroup is the group recorded for the scope and topic before
	// ("" for none).
	PreviousGroup string   `json:"previous_group"`
	RetiredKeys   int64    `json:"retired_keys"`
	Truncated     []string `json:"truncated"`
	Executed      bool     `json:"executed"`
	// LostBefore sums, over the partitions, the records no longer in Kafka
	// (below the log start): the rebuild cannot apply them again.
	LostBefore int64 `json:"records_no_longer_in_kafka"`
}

// Rebuild prepares a rebuild of what a scope's handler wrote: in one
// transaction it truncates the handler's tables, deletes the scope's keys
// (pgstore.Store.RetireScopeTx) and records Group as the scope's group on
// Topic (pgstore.Store.RegisterScopeTx, taking it over). Workers of Group,
// started then, read Topic from its start and apply every command again,
// once. It refuses a Group with active members or committed offsets on
// Topic. See docs/rebuild.md.
func Rebuild(ctx context.Context, o RebuildConfig) (RebuildReport, error) {
	rep := RebuildReport{Scope: o.Scope, Topic: o.Topic, Group: o.Group, Truncated: o.Truncate, Executed: o.Execute}
	if o.Scope == "" || o.Topic == "" || o.Group == "" || o.DatabaseURL == "" {
		return rep, fmt.Errorf("%w: --scope, --topic, --group and --database-url (or DATABASE_URL) are required", errUsage)
	}
	k := newKafka(o.Brokers, o.Security)
	n, err := k.partitions(ctx, o.Topic)
	if err != nil {
		return rep, err
	}
	state, members, err := k.groupState(ctx, o.Group)
	if err != nil {
		return rep, err
	}
	if members > 0 {
		return rep, fmt.Errorf("%w: %q is %s with %d member(s): start the rebuilding group's workers after the rebuild, "+
			"or pick a new group", errGroupActive, o.Group, state, members)
	}
	committed, err := k.committed(ctx, o.Group, o.Topic, n)
	if err != nil {
		return rep, err
	}
	for p, c := range committed {
		if c >= 0 {
			return rep, fmt.Errorf("%w: group %q has committed offset %d on partition %d of %s, so it would not read the topic "+
				"from its start: pick a new group, or rewind this one first (replay rewind --to-offset 0)", errGroupActive, o.Group, c, p, o.Topic)
		}
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	first, err := k.listFirst(ctx, o.Topic, parts)
	if err != nil {
		return rep, err
	}
	for _, f := range first {
		rep.LostBefore += f
	}

	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return rep, fmt.Errorf("%w at %s: %v", errDatabase, Redact(o.DatabaseURL), redact.Error(err, o.DatabaseURL))
	}
	defer pool.Close()
	if o.Schema == "" {
		o.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: o.Schema})
	if err != nil {
		return rep, fmt.Errorf("%w: %v", errUsage, err)
	}
	var tables []string
	for _, t := range o.Truncate {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		schema, name, ok := strings.Cut(t, ".")
		if !ok {
			schema, name = o.Schema, t
		}
		tables = append(tables, pgx.Identifier{schema, name}.Sanitize())
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if len(tables) > 0 && o.Execute {
			if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
				return fmt.Errorf("truncate: %w", err)
			}
		}
		if rep.RetiredKeys, err = store.RetireScopeTx(ctx, tx, o.Scope); err != nil {
			return err
		}
		prev, err := store.RegisterScopeTx(ctx, tx, o.Scope, o.Topic, o.Group, true)
		if err != nil {
			return fmt.Errorf("record group %s for the scope: %w", o.Group, err)
		}
		rep.PreviousGroup = prev.Group
		if !o.Execute {
			return errDryRun
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return rep, fmt.Errorf("%w: %v", errDatabase, redact.Error(err, o.DatabaseURL))
	}
	return rep, nil
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("dry run")

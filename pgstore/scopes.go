package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/exactly-go/exactly/dedupe"
)

// scopesTable is the table of the scopes' groups (migration 00011).
const scopesTable = "exactly_scopes"

// ScopeOwner is the consumer group recorded for a scope's commands on a
// topic, and since when.
type ScopeOwner struct {
	Scope, Topic, Group string
	Since               time.Time
}

// ScopeTakenError is what [Store.RegisterScope] returns when another
// consumer group is recorded for the scope and topic: a second group with
// the same scope on the same topic finds every key the first stored, and
// skips its commands as duplicates. It wraps [dedupe.ErrMisconfigured].
type ScopeTakenError struct {
	// Owner is the group recorded for the scope and topic.
	Owner ScopeOwner
	// Group is the group that was refused.
	Group string
}

func (e *ScopeTakenError) Error() string {
	return fmt.Sprintf("pgstore: scope %q on topic %q is consumed by group %q (since %s), not by group %q: "+
		"the keys of the one are the keys of the other, so group %q would skip every command that group %q applied as a duplicate; "+
		"if it is another service, give it a Scope of its own; if group %q takes the scope over on purpose "+
		"(a renamed group, a rebuild: docs/rebuild.md), set worker.Config.TakeOver (pgstore.Store.RegisterScope's takeOver), "+
		"or run replay rebuild",
		e.Owner.Scope, e.Owner.Topic, e.Owner.Group, e.Owner.Since.UTC().Format(time.RFC3339), e.Group,
		e.Group, e.Owner.Group, e.Group)
}

// Unwrap returns dedupe.ErrMisconfigured.
func (e *ScopeTakenError) Unwrap() error { return dedupe.ErrMisconfigured }

// RegisterScope records group as the consumer group of scope's commands
// on topic, in the table exactly_scopes of the store's schema (migration
// 00011), and returns the group recorded before (zero when there was none,
// or it was group already). When another group is recorded, it returns a
// *[ScopeTakenError] unless takeOver is set; with takeOver, group replaces
// it (a renamed group, a rebuild). worker.Worker calls it at start.
func (s *Store) RegisterScope(ctx context.Context, scope, topic, group string, takeOver bool) (ScopeOwner, error) {
	if scope == "" || topic == "" || group == "" {
		return ScopeOwner{}, errors.New("pgstore: RegisterScope: scope, topic and group are required")
	}
	var prev ScopeOwner
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		prev, err = s.RegisterScopeTx(ctx, tx, scope, topic, group, takeOver)
		return err
	})
	var taken *ScopeTakenError
	if errors.As(err, &taken) {
		return prev, err
	}
	return prev, classify("register scope "+scope, err)
}

// RegisterScopeTx is [Store.RegisterScope] in tx: a rebuild records its
// new group in the transaction that retires the scope's keys
// ([Store.RetireScopeTx]). Its errors are the database's as they are, or
// a *[ScopeTakenError].
func (s *Store) RegisterScopeTx(ctx context.Context, tx pgx.Tx, scope, topic, group string, takeOver bool) (ScopeOwner, error) {
	t := pgx.Identifier{s.cfg.Schema, scopesTable}.Sanitize()
	if _, err := tx.Exec(ctx, "INSERT INTO "+t+" (scope, topic, consumer_group) VALUES ($1, $2, $3) ON CONFLICT (scope, topic) DO NOTHING",
		scope, topic, group); err != nil {
		return ScopeOwner{}, err
	}
	owner := ScopeOwner{Scope: scope, Topic: topic}
	if err := tx.QueryRow(ctx, "SELECT consumer_group, since FROM "+t+" WHERE scope = $1 AND topic = $2 FOR UPDATE",
		scope, topic).Scan(&owner.Group, &owner.Since); err != nil {
		return ScopeOwner{}, err
	}
	if owner.Group == group {
		return ScopeOwner{}, nil
	}
	if !takeOver {
		return owner, &ScopeTakenError{Owner: owner, Group: group}
	}
	if _, err := tx.Exec(ctx, "UPDATE "+t+" SET consumer_group = $3, since = now() WHERE scope = $1 AND topic = $2",
		scope, topic, group); err != nil {
		return ScopeOwner{}, err
	}
	return owner, nil
}

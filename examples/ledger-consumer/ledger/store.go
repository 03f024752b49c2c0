package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Setup creates the ledger's tables in schema (the schema must exist).
func Setup(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	s := pgx.Identifier{schema}.Sanitize()
	// CREATE TABLE IF NOT EXISTS is not safe against itself: two workers
	// migrating at once fail on pg_type's unique index. A transaction-level
	// advisory lock per schema serialises them.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ledger: setup: %w", err)
	}
	defer func() { // rolled back unless committed, even once ctx is done
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('exactly/ledger/setup/' || $1))", schema); err != nil {
		return fmt.Errorf("ledger: setup lock: %w", err)
	}
	_, err = tx.Exec(ctx, `
CREATE TABLE IF NOT EXISTS `+s+`.accounts (
    id        text PRIMARY KEY,
    available bigint NOT NULL DEFAULT 0 CHECK (available >= 0),
    held      bigint NOT NULL DEFAULT 0 CHECK (held >= 0)
);
CREATE TABLE IF NOT EXISTS `+s+`.holds (
    id       text PRIMARY KEY,
    account  text NOT NULL,
    amount   bigint NOT NULL,
    captured bigint NOT NULL DEFAULT 0,
    released bigint NOT NULL DEFAULT 0,
    refunded bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS `+s+`.rejections (
    command_id text PRIMARY KEY,
    type       text NOT NULL,
    account    text NOT NULL,
    reason     text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);`)
	if err != nil {
		return fmt.Errorf("ledger: setup: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ledger: setup: %w", err)
	}
	return nil
}

// txState is State on a transaction. It is correct whatever the
// partitioning: Account locks the account's row until commit, creating the
// row first when it is missing (a SELECT … FOR UPDATE of a missing row
// locks nothing, so two commands creating one account would both start
// from zero); every hold is created by one INSERT that loses cleanly to a
// concurrent one; writes go to rows this transaction has locked. Locks are
// taken account first, then hold, so commands do not deadlock.
type txState struct {
	ctx    context.Context
	tx     pgx.Tx
	schema string
}

func (s *txState) t(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

func (s *txState) Account(id string) (Account, error) {
	var a Account
	lock := "SELECT available, held FROM " + s.t("accounts") + " WHERE id = $1 FOR UPDATE"
	err := s.tx.QueryRow(s.ctx, lock, id).Scan(&a.Available, &a.Held)
	if errors.Is(err, pgx.ErrNoRows) {
		// A new account: insert it (waiting for a concurrent insert of the
		// same account to commit or roll back), then lock the row, which
		// now exists whoever inserted it.
		if _, err := s.tx.Exec(s.ctx, "INSERT INTO "+s.t("accounts")+" (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", id); err != nil {
			return a, err
		}
		err = s.tx.QueryRow(s.ctx, lock, id).Scan(&a.Available, &a.Held)
	}
	return a, err
}

func (s *txState) SetAccount(id string, a Account) error {
	tag, err := s.tx.Exec(s.ctx, "UPDATE "+s.t("accounts")+" SET available = $2, held = $3 WHERE id = $1", id, a.Available, a.Held)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("ledger: account %s was not read before it was written", id)
	}
	return err
}

func (s *txState) Hold(id string) (HoldState, bool, error) {
	var h HoldState
	err := s.tx.QueryRow(s.ctx, "SELECT account, amount, captured, released, refunded FROM "+s.t("holds")+" WHERE id = $1 FOR UPDATE", id).
		Scan(&h.Account, &h.Amount, &h.Captured, &h.Released, &h.Refunded)
	if errors.Is(err, pgx.ErrNoRows) {
		return HoldState{}, false, nil
	}
	return h, err == nil, err
}

func (s *txState) CreateHold(id string, h HoldState) (bool, error) {
	tag, err := s.tx.Exec(s.ctx, "INSERT INTO "+s.t("holds")+" (id, account, amount, captured, released, refunded) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
		id, h.Account, h.Amount, h.Captured, h.Released, h.Refunded)
	return err == nil && tag.RowsAffected() == 1, err
}

func (s *txState) SetHold(id string, h HoldState) error {
	tag, err := s.tx.Exec(s.ctx, "UPDATE "+s.t("holds")+" SET captured = $2, released = $3, refunded = $4 WHERE id = $1", id, h.Captured, h.Released, h.Refunded)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("ledger: hold %s was not read before it was written", id)
	}
	return err
}

// Balances reads every account's balances.
func Balances(ctx context.Context, pool *pgxpool.Pool, schema string) (map[string]Account, error) {
	rows, err := pool.Query(ctx, "SELECT id, available, held FROM "+pgx.Identifier{schema, "accounts"}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("ledger: balances: %w", err)
	}
	out := map[string]Account{}
	for rows.Next() {
		var id string
		var a Account
		if err := rows.Scan(&id, &a.Available, &a.Held); err != nil {
			return nil, err
		}
		out[id] = a
	}
	return out, rows.Err()
}

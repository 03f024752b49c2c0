package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/exactly-go/exactly/consumer"
	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/outbox"
)

// handleBatch applies a batch of commands in tx, set-based: it locks every
// account the batch touches (creating the missing ones) and every hold it
// names, in one round trip and in id order, applies the commands in memory
// in their order with the same rules as one command at a time (Apply), and
// writes the changed accounts, the new and the changed holds and the
// rejections back with one statement each, in one more round trip. A
// payload that is not a command fails the batch with a consumer.MessageError
// per such message: the consumer applies the batch again without them and
// dead-letters them.
func (w *Worker) handleBatch(ctx context.Context, tx pgx.Tx, msgs []*message.Message) ([][]*message.Message, error) {
	cmds := make([]Command, len(msgs))
	var malformed []error
	for i, m := range msgs {
		c, err := Parse(m.Payload)
		if err != nil {
			malformed = append(malformed, &consumer.MessageError{Index: i, Err: err})
		}
		cmds[i] = c
	}
	if len(malformed) > 0 {
		return nil, errors.Join(malformed...)
	}
	st, err := w.lockBatch(ctx, tx, cmds)
	if err != nil {
		return nil, err
	}
	outs := make([][]*message.Message, len(cmds))
	var rejected []int
	var reasons []string
	for i, c := range cmds {
		ev := eventPayload{CommandID: c.CommandID, Type: c.Type, Account: c.Account, Outcome: "applied"}
		if err := Apply(st, c); err != nil {
			var rej *Rejection
			if !errors.As(err, &rej) {
				return nil, err
			}
			ev.Outcome, ev.Reason = "rejected", rej.Reason
			rejected, reasons = append(rejected, i), append(reasons, rej.Reason)
		}
		acc := st.accounts[c.Account]
		ev.Available, ev.Held = acc.Available, acc.Held
		payload, _ := json.Marshal(ev)
		out := message.NewMessage("evt-"+c.CommandID, payload)
		out.Metadata.Set(outbox.KeyMetadata, c.Account)
		outs[i] = []*message.Message{out}
	}
	if err := w.writeBatch(ctx, tx, st, cmds, rejected, reasons); err != nil {
		return nil, err
	}
	for range rejected {
		w.Metrics.onRejected()
	}
	return outs, nil
}

// batchState is State on the rows that a batch locked.
type batchState struct {
	accounts map[string]Account
	holds    map[string]HoldState
	// created are the holds that the batch creates; changed, the existing
	// holds and the accounts it writes.
	created, changedHolds, changedAccounts map[string]bool
}

func (s *batchState) Account(id string) (Account, error) {
	a, ok := s.accounts[id]
	if !ok {
		return a, fmt.Errorf("ledger: account %s was not locked by the batch", id)
	}
	return a, nil
}

func (s *batchState) SetAccount(id string, a Account) error {
	s.accounts[id] = a
	s.changedAccounts[id] = true
	return nil
}

func (s *batchState) Hold(id string) (HoldState, bool, error) {
	h, ok := s.holds[id]
	return h, ok, nil
}

func (s *batchState) CreateHold(id string, h HoldState) (bool, error) {
	if _, ok := s.holds[id]; ok {
		return false, nil
	}
	s.holds[id] = h
	s.created[id] = true
	return true, nil
}

func (s *batchState) SetHold(id string, h HoldState) error {
	s.holds[id] = h
	if !s.created[id] {
		s.changedHolds[id] = true
	}
	return nil
}

// lockBatch creates the batch's missing accounts and locks its accounts
// and holds, in id order (accounts first, as one command does), in one
// round trip.
func (w *Worker) lockBatch(ctx context.Context, tx pgx.Tx, cmds []Command) (*batchState, error) {
	var accounts, holds []string
	for _, c := range cmds {
		accounts = append(accounts, c.Account)
		if c.HoldID != "" {
			holds = append(holds, c.HoldID)
		}
	}
	slices.Sort(accounts)
	accounts = slices.Compact(accounts)
	slices.Sort(holds)
	holds = slices.Compact(holds)
	t := func(name string) string { return pgx.Identifier{w.cfg.Schema, name}.Sanitize() }
	b := &pgx.Batch{}
	b.Queue("INSERT INTO "+t("accounts")+" (id) SELECT id FROM unnest($1::text[]) AS id ORDER BY id ON CONFLICT (id) DO NOTHING", accounts)
	b.Queue("SELECT id, available, held FROM "+t("accounts")+" WHERE id = ANY($1) ORDER BY id FOR UPDATE", accounts)
	if len(holds) > 0 {
		b.Queue("SELECT id, account, amount, captured, released, refunded FROM "+t("holds")+" WHERE id = ANY($1) ORDER BY id FOR UPDATE", holds)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	st := &batchState{accounts: make(map[string]Account, len(accounts)), holds: make(map[string]HoldState, len(holds)),
		created: map[string]bool{}, changedHolds: map[string]bool{}, changedAccounts: map[string]bool{}}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("ledger: create accounts: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("ledger: lock accounts: %w", err)
	}
	for rows.Next() {
		var id string
		var a Account
		if err := rows.Scan(&id, &a.Available, &a.Held); err != nil {
			rows.Close()
			return nil, err
		}
		st.accounts[id] = a
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: lock accounts: %w", err)
	}
	if len(holds) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("ledger: lock holds: %w", err)
		}
		for rows.Next() {
			var id string
			var h HoldState
			if err := rows.Scan(&id, &h.Account, &h.Amount, &h.Captured, &h.Released, &h.Refunded); err != nil {
				rows.Close()
				return nil, err
			}
			st.holds[id] = h
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("ledger: lock holds: %w", err)
		}
	}
	return st, br.Close()
}

// writeBatch writes what the batch changed, one statement per table, in
// one round trip, one row per changed account or hold (the batch's
// commands were applied in memory first, in order): an UPDATE … FROM
// unnest(…) with a row per command would update an account that two
// commands of the batch touch once, with one of the two, and lose the
// other's effect without an error (docs/batch.md, "One source row per
// target row"). Each statement is in id order: two batches that create the same holds
// insert them in the same order, so the later waits for the earlier
// instead of deadlocking with it. A hold that another transaction created
// meanwhile (a command of another account naming the same hold id, on
// another partition) makes the batch run again, which then sees it.
func (w *Worker) writeBatch(ctx context.Context, tx pgx.Tx, st *batchState, cmds []Command, rejected []int, reasons []string) error {
	t := func(name string) string { return pgx.Identifier{w.cfg.Schema, name}.Sanitize() }
	b := &pgx.Batch{}
	if len(st.changedAccounts) > 0 {
		var ids []string
		var avail, held []int64
		for _, id := range slices.Sorted(maps.Keys(st.changedAccounts)) {
			a := st.accounts[id]
			ids, avail, held = append(ids, id), append(avail, a.Available), append(held, a.Held)
		}
		b.Queue("UPDATE "+t("accounts")+" AS a SET available = u.available, held = u.held "+
			"FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(id, available, held) WHERE a.id = u.id", ids, avail, held)
	}
	if len(st.created) > 0 {
		var ids, accs []string
		var amount, captured, released, refunded []int64
		for _, id := range slices.Sorted(maps.Keys(st.created)) {
			h := st.holds[id]
			ids, accs = append(ids, id), append(accs, h.Account)
			amount, captured, released, refunded = append(amount, h.Amount), append(captured, h.Captured), append(released, h.Released), append(refunded, h.Refunded)
		}
		b.Queue("INSERT INTO "+t("holds")+" (id, account, amount, captured, released, refunded) "+
			"SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[]) "+
			"AS u(id, account, amount, captured, released, refunded) ORDER BY id ON CONFLICT (id) DO NOTHING",
			ids, accs, amount, captured, released, refunded).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(len(ids)) {
				return dedupe.Retryable(errors.New("ledger: a hold of this batch was created meanwhile by another transaction"))
			}
			return nil
		})
	}
	if len(st.changedHolds) > 0 {
		var ids []string
		var captured, released, refunded []int64
		for _, id := range slices.Sorted(maps.Keys(st.changedHolds)) {
			h := st.holds[id]
			ids = append(ids, id)
			captured, released, refunded = append(captured, h.Captured), append(released, h.Released), append(refunded, h.Refunded)
		}
		b.Queue("UPDATE "+t("holds")+" AS h SET captured = u.captured, released = u.released, refunded = u.refunded "+
			"FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(id, captured, released, refunded) WHERE h.id = u.id",
			ids, captured, released, refunded)
	}
	if len(rejected) > 0 {
		var ids, types, accs []string
		for _, i := range rejected {
			ids, types, accs = append(ids, cmds[i].CommandID), append(types, cmds[i].Type), append(accs, cmds[i].Account)
		}
		b.Queue("INSERT INTO "+t("rejections")+" (command_id, type, account, reason) "+
			"SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) ON CONFLICT (command_id) DO NOTHING", ids, types, accs, reasons)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: write the batch: %w", err)
	}
	return nil
}

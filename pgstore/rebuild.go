package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// RetireScopeTx deletes every key of scope, in tx: its commands are then
// applied again when they are delivered again, by a consumer group that
// reads the topic from its start (a rebuild of a read model:
// docs/rebuild.md, replay rebuild). It returns how many keys it deleted.
//
// Run it in the transaction that empties what the scope's handler wrote
// (TRUNCATE of its tables): the TRUNCATE waits for the handlers'
// transactions that wrote those tables and holds back the next until the
// commit, and the DELETE, after it, sees every key those committed. A key
// goes with its effects, and a command applied after the commit keeps both,
// so each command's effect is in the tables once, whether the old group's
// workers still run or not. Without a TRUNCATE in the same transaction,
// stop the scope's workers first.
//
// On LayoutPartitioned it deletes from the partitioned table and from the
// single table while it is still read (an upgraded deployment's), which
// takes DELETE on both (the tables' owner has it); on LayoutSingleTable,
// from Config.Table.
func (s *Store) RetireScopeTx(ctx context.Context, tx pgx.Tx, scope string) (int64, error) {
	if scope == "" {
		return 0, errors.New("pgstore: RetireScopeTx: scope is empty")
	}
	var n int64
	del := func(table, where string) error {
		tag, err := tx.Exec(ctx, "DELETE FROM "+table+" WHERE "+where, scope)
		n += tag.RowsAffected()
		return err
	}
	p, ok := s.l.(*partitioned)
	if !ok {
		return n, classify("retire scope "+scope, del(s.table, "scope = $1"))
	}
	if err := del(p.parent, "scope = (SELECT code FROM "+p.names+" WHERE name = $1)"); err != nil {
		return n, classify("retire scope "+scope, err)
	}
	var legacy *string
	if err := tx.QueryRow(ctx, "SELECT CASE WHEN legacy IS NULL THEN NULL WHEN to_regclass(format('%I.%I', $1::text, legacy)) IS NOT NULL THEN legacy END FROM "+p.state,
		p.schema).Scan(&legacy); err != nil {
		return n, classify("retire scope "+scope, err)
	}
	if legacy != nil {
		if err := del(p.quoted(*legacy), "scope = $1"); err != nil {
			return n, classify("retire scope "+scope, err)
		}
	}
	return n, nil
}

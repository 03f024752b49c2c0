package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/internal/sqlident"
)

// PositionsConfig configures Positions. The zero value (or a nil
// *PositionsConfig) is usable.
type PositionsConfig struct {
	// Schema holds the table. Defaults to the first schema of the pool's
	// search_path, else "public", as Config.Schema does.
	Schema string
	// Table is the positions table's name. Defaults to "exactly_positions",
	// the table that the migrations create. Claim and SaveClaimed use its
	// companion, Table + "_claims" (exactly_positions_claims, migration
	// 00013): a table of your own needs one with the columns that
	// migration gives it.
	Table string
}

// Positions keeps consumer groups' committed offsets in Postgres, next to
// the effects they cover: it is the kafkapubsub.Positions of a Subscriber
// whose handlers write to this database (set
// kafkapubsub.SubscriberConfig.Positions to [Store.Positions] or to a
// Positions of [NewPositions]). A database that loses its last commits
// loses the positions past what it kept with them, and the Subscriber
// starts there again. It is safe for concurrent use.
type Positions struct {
	pool        *pgxpool.Pool
	table       string // schema-qualified and quoted
	claims      string // the claims table, schema-qualified and quoted
	load        string
	save        string
	claim       string
	saveClaimed string
}

// NewPositions returns Positions on pool. cfg may be nil. The table must
// exist: run migrations.Migrate first (or goose with migrations.FS).
func NewPositions(pool *pgxpool.Pool, cfg *PositionsConfig) (*Positions, error) {
	if pool == nil {
		return nil, errors.New("pgstore: pool is nil")
	}
	var c PositionsConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = sqlident.DefaultSchema(pool.Config().ConnConfig)
	}
	if c.Table == "" {
		c.Table = "exactly_positions"
	}
	if err := sqlident.Check("pgstore: PositionsConfig.Schema", c.Schema); err != nil {
		return nil, err
	}
	if err := sqlident.Check("pgstore: PositionsConfig.Table", c.Table); err != nil {
		return nil, err
	}
	return newPositions(pool, pgx.Identifier{c.Schema, c.Table}.Sanitize(), pgx.Identifier{c.Schema, c.Table + "_claims"}.Sanitize()), nil
}

func newPositions(pool *pgxpool.Pool, table, claims string) *Positions {
	return &Positions{pool: pool, table: table, claims: claims,
		load: "SELECT partition, next_offset FROM " + table + " WHERE consumer_group = $1 AND topic = $2 AND partition = ANY($3::int[])",
		// Nothing is stored when a partition with an expected position
		// (expected >= 0) holds less, or no row: the database went back in
		// time. The rows are locked, then upserted, in partition order, so
		// that two savers of overlapping partitions (a member and the one it
		// handed them to) lock them in the same order. With $6 (a running
		// consumer's save) a position past the one saved is kept: the saver
		// lost the partition, and its new owner saved further.
		save: `WITH u AS (
    SELECT * FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS u(partition, next_offset, expected)
), cur AS (
    SELECT p.partition, p.next_offset FROM ` + table + ` p
    WHERE p.consumer_group = $1 AND p.topic = $2 AND p.partition = ANY($3::int[])
    ORDER BY p.partition FOR UPDATE
), behind AS (
    SELECT u.partition, coalesce(cur.next_offset, -1) AS next_offset FROM u LEFT JOIN cur USING (partition)
    WHERE u.expected >= 0 AND (cur.next_offset IS NULL OR cur.next_offset < u.expected)
), up AS (
    INSERT INTO ` + table + ` AS p (consumer_group, topic, partition, next_offset, updated_at)
    SELECT $1, $2, u.partition, u.next_offset, now() FROM u WHERE NOT EXISTS (SELECT FROM behind) ORDER BY u.partition
    ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at
    WHERE NOT $6 OR p.next_offset <= excluded.next_offset
)
SELECT partition, next_offset FROM behind`,
		// A claim takes each partition in partition order and reads its
		// position as the claim commits. Its epoch is above the last one
		// stored and at least the clock in microseconds: a database
		// restored to an older epoch still gives a new owner an epoch above
		// those of the members that claimed before the restore.
		claim: `WITH c AS (
    INSERT INTO ` + claims + ` AS c (consumer_group, topic, partition, epoch)
    SELECT $1, $2, n, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM unnest($3::int[]) AS n ORDER BY n
    ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET epoch = greatest(c.epoch + 1, excluded.epoch), claimed_at = now()
    RETURNING c.partition, c.epoch
)
SELECT c.partition, c.epoch, p.next_offset FROM c LEFT JOIN ` + table + ` p
    ON p.consumer_group = $1 AND p.topic = $2 AND p.partition = c.partition`,
		// save, fenced by the claims: a partition claimed since with a
		// higher epoch than the saver's ($6; -1 for none) is lost to the
		// saver and stores nothing. The claims are locked (FOR SHARE) before
		// the positions, so a claim in progress is waited for and read as
		// it committed.
		saveClaimed: `WITH u AS (
    SELECT * FROM unnest($3::int[], $4::bigint[], $5::bigint[], $6::bigint[]) AS u(partition, next_offset, expected, epoch)
), cl AS (
    SELECT c.partition, c.epoch FROM ` + claims + ` c
    WHERE c.consumer_group = $1 AND c.topic = $2 AND c.partition = ANY($3::int[])
    ORDER BY c.partition FOR SHARE
), lost AS (
    SELECT u.partition, cl.epoch FROM u JOIN cl USING (partition) WHERE u.epoch >= 0 AND cl.epoch > u.epoch
), cur AS (
    SELECT p.partition, p.next_offset FROM ` + table + ` p
    WHERE p.consumer_group = $1 AND p.topic = $2 AND p.partition = ANY($3::int[])
    ORDER BY p.partition FOR UPDATE
), behind AS (
    SELECT u.partition, coalesce(cur.next_offset, -1) AS next_offset FROM u LEFT JOIN cur USING (partition)
    WHERE u.expected >= 0 AND (cur.next_offset IS NULL OR cur.next_offset < u.expected)
      AND u.partition NOT IN (SELECT partition FROM lost)
), up AS (
    INSERT INTO ` + table + ` AS p (consumer_group, topic, partition, next_offset, updated_at)
    SELECT $1, $2, u.partition, u.next_offset, now() FROM u
    WHERE NOT EXISTS (SELECT FROM behind) AND u.partition NOT IN (SELECT partition FROM lost) ORDER BY u.partition
    ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at
    WHERE p.next_offset <= excluded.next_offset
)
SELECT partition, next_offset, false FROM behind UNION ALL SELECT partition, epoch, true FROM lost`,
	}
}

// Positions returns the Positions in the store's schema, on its pool (the
// table exactly_positions, which the migrations create next to the keys).
func (s *Store) Positions() *Positions {
	schema := s.cfg.Schema
	return newPositions(s.pool, pgx.Identifier{schema, "exactly_positions"}.Sanitize(), pgx.Identifier{schema, "exactly_positions_claims"}.Sanitize())
}

// Load returns the stored next offset of each of partitions that has one.
func (p *Positions) Load(ctx context.Context, group, topic string, partitions []int) (map[int]int64, error) {
	return p.LoadTx(ctx, p.pool, group, topic, partitions)
}

// LoadTx is Load on db.
func (p *Positions) LoadTx(ctx context.Context, db DBTX, group, topic string, partitions []int) (map[int]int64, error) {
	parts := make([]int32, len(partitions))
	for i, n := range partitions {
		parts[i] = int32(n)
	}
	rows, err := db.Query(ctx, p.load, group, topic, parts)
	if err != nil {
		return nil, classify("load positions of "+topic, err)
	}
	out := map[int]int64{}
	var part int32
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &next}, func() error {
		out[int(part)] = next
		return nil
	}); err != nil {
		return nil, classify("load positions of "+topic, err)
	}
	return out, nil
}

// Save stores offsets (partition → next offset to consume) in one
// statement, unless for a partition of expected the table holds a position
// below the expected one, or none: then the database lost commits (a
// failover, a restore) since that position was loaded or saved, nothing is
// stored, and behind holds what the table has for those partitions (-1 for
// no row). Call it only with offsets below which every message's effects
// committed.
//
// With expected not nil (as kafkapubsub's and kgopubsub's Subscribers
// call it, for every save), no position moves backwards: a partition whose
// stored position is past its offset keeps it (a member that lost the
// partition without knowing it, cut off from Kafka, saves late, after the
// partition's new owner saved further). With expected nil, every offset is
// stored as it is, lower ones too (a group rewound by an operator, a topic
// recreated).
func (p *Positions) Save(ctx context.Context, group, topic string, offsets, expected map[int]int64) (behind map[int]int64, err error) {
	return p.SaveTx(ctx, p.pool, group, topic, offsets, expected)
}

// SaveTx is Save on db: in a transaction it commits with the caller's
// effects.
func (p *Positions) SaveTx(ctx context.Context, db DBTX, group, topic string, offsets, expected map[int]int64) (behind map[int]int64, err error) {
	if len(offsets) == 0 {
		return nil, nil
	}
	parts := slices.Sorted(maps.Keys(offsets))
	ids := make([]int32, len(parts))
	nexts := make([]int64, len(parts))
	exps := make([]int64, len(parts))
	for i, n := range parts {
		if offsets[n] < 0 {
			return nil, fmt.Errorf("pgstore: save positions of %s: partition %d at offset %d: a position is an offset, 0 or more", topic, n, offsets[n])
		}
		ids[i], nexts[i], exps[i] = int32(n), offsets[n], -1
		if e, ok := expected[n]; ok && e >= 0 {
			exps[i] = e
		}
	}
	rows, err := db.Query(ctx, p.save, group, topic, ids, nexts, exps, expected != nil)
	if err != nil {
		return nil, classify("save positions of "+topic, err)
	}
	var part int32
	var next int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &next}, func() error {
		if behind == nil {
			behind = map[int]int64{}
		}
		behind[int(part)] = next
		return nil
	}); err != nil {
		return nil, classify("save positions of "+topic, err)
	}
	return behind, nil
}

// Claim takes partitions of group's topic for the caller, a Subscriber
// they were just assigned to, and returns their stored positions (as Load
// does: a partition with none is absent) and the epoch of each claim. Every
// claim raises the partition's epoch (to at least the database's clock in
// microseconds, so that claims made after a restore are above those made
// before it), so a save by a member that claimed it before ([Positions.SaveClaimed] with the older epoch) stores nothing
// for it: that member lost the partition, whether it knows it yet or not.
// The claims are kept in the positions table's companion,
// exactly_positions_claims (migration 00013), which the positions table's
// grants cover.
func (p *Positions) Claim(ctx context.Context, group, topic string, partitions []int) (positions, epochs map[int]int64, err error) {
	parts := slices.Sorted(slices.Values(partitions))
	parts = slices.Compact(parts)
	ids := make([]int32, len(parts))
	for i, n := range parts {
		ids[i] = int32(n)
	}
	rows, err := p.pool.Query(ctx, p.claim, group, topic, ids)
	if err != nil {
		return nil, nil, classify("claim positions of "+topic, err)
	}
	positions, epochs = map[int]int64{}, map[int]int64{}
	var part int32
	var epoch int64
	var next *int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &epoch, &next}, func() error {
		epochs[int(part)] = epoch
		if next != nil {
			positions[int(part)] = *next
		}
		return nil
	}); err != nil {
		return nil, nil, classify("claim positions of "+topic, err)
	}
	return positions, epochs, nil
}

// SaveClaimed is Save for a Subscriber that claimed its partitions
// ([Positions.Claim]): epochs holds the epoch it claimed each partition
// with. A partition claimed since by another (its epoch is higher) stores
// nothing and is returned in lost; the others are saved as Save with a
// non-nil expected saves them (never backwards; nothing at all when one is
// behind). A partition absent from epochs is saved unfenced.
func (p *Positions) SaveClaimed(ctx context.Context, group, topic string, offsets, expected, epochs map[int]int64) (behind map[int]int64, lost []int, err error) {
	if len(offsets) == 0 {
		return nil, nil, nil
	}
	parts := slices.Sorted(maps.Keys(offsets))
	ids := make([]int32, len(parts))
	nexts := make([]int64, len(parts))
	exps := make([]int64, len(parts))
	eps := make([]int64, len(parts))
	for i, n := range parts {
		if offsets[n] < 0 {
			return nil, nil, fmt.Errorf("pgstore: save positions of %s: partition %d at offset %d: a position is an offset, 0 or more", topic, n, offsets[n])
		}
		ids[i], nexts[i], exps[i], eps[i] = int32(n), offsets[n], -1, -1
		if e, ok := expected[n]; ok && e >= 0 {
			exps[i] = e
		}
		if e, ok := epochs[n]; ok && e >= 0 {
			eps[i] = e
		}
	}
	rows, err := p.pool.Query(ctx, p.saveClaimed, group, topic, ids, nexts, exps, eps)
	if err != nil {
		return nil, nil, classify("save positions of "+topic, err)
	}
	var part int32
	var val int64
	var isLost bool
	if _, err := pgx.ForEachRow(rows, []any{&part, &val, &isLost}, func() error {
		if isLost {
			lost = append(lost, int(part))
			return nil
		}
		if behind == nil {
			behind = map[int]int64{}
		}
		behind[int(part)] = val
		return nil
	}); err != nil {
		return nil, nil, classify("save positions of "+topic, err)
	}
	slices.Sort(lost)
	return behind, lost, nil
}

// Check reports whether the table and its claims are there and readable.
func (p *Positions) Check(ctx context.Context) error {
	if _, err := p.pool.Exec(ctx, "SELECT consumer_group, topic, partition, next_offset, updated_at FROM "+p.table+" LIMIT 0"); err != nil {
		return classify("check "+p.table, err)
	}
	_, err := p.pool.Exec(ctx, "SELECT consumer_group, topic, partition, epoch FROM "+p.claims+" LIMIT 0")
	return classify("check "+p.claims, err)
}

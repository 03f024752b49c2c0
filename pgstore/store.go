package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
	"github.com/exactly-go/exactly/internal/advisory"
	"github.com/exactly-go/exactly/internal/pooler"
)

// DBTX is what the queries run on: a pool, a connection or a transaction.
// It is an alias of its method set, so that an interface of another
// package that names the same method set (httpkey.Store's GetTx) is met
// by [Store.GetTx].
type DBTX = interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the dedupe.Store on Postgres. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	cfg    Config
	table  string // schema-qualified and quoted
	lockID int64
	// beginSQL opens Do's transactions at Config.IsoLevel.
	beginSQL string
	// l is Config.Layout: its statements and its own steps.
	l layout
	// batchFoundStored: a batch claim found a key stored already, and none
	// has inserted all of its keys since. DoBatch then skips the insert
	// that answers only a count (batchStmts.insert), which batches of
	// duplicates (a redelivery) would each roll back.
	batchFoundStored atomic.Bool
	// pooler is what pooler.Detect found on pool, once it answered.
	pooler struct {
		mu    sync.Mutex
		known bool
		info  pooler.Info
	}
}

var _ dedupe.Store[pgx.Tx] = (*Store)(nil)

// New returns a Store on pool. cfg may be nil. The table must exist: run
// migrations.Migrate first (or goose with migrations.FS).
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: pool is nil")
	}
	c, err := cfg.withDefaults(pool)
	if err != nil {
		return nil, err
	}
	table := pgx.Identifier{c.Schema, c.Table}.Sanitize()
	s := &Store{pool: pool, cfg: c, table: table, lockID: advisory.LockID("cleanup/" + c.Schema + "." + c.Table),
		beginSQL: "begin isolation level " + strings.ToLower(string(c.IsoLevel))}
	if c.Layout == LayoutPartitioned {
		s.l = newPartitioned(s, c.Schema, c.Table)
	} else {
		s.l = newSingleTable(s, c.Schema, c.Table)
	}
	return s, nil
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Pool returns the pool the store runs on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Begin opens a transaction at Config.IsoLevel that claims no key.
func (s *Store) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: s.cfg.IsoLevel})
	if err != nil {
		return nil, fmt.Errorf("pgstore: begin: %w", err)
	}
	return tx, nil
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: ping: %w", err)
	}
	return nil
}

// KeySpace names where the store keeps its keys: its pool and table. Stores
// with the same KeySpace share keys.
func (s *Store) KeySpace() string { return fmt.Sprintf("%p %s", s.pool, s.table) }

func micros(d time.Duration) float64 { return float64(d.Microseconds()) }

func (s *Store) ttl(req dedupe.Request) time.Duration {
	if req.TTL > 0 {
		return req.TTL
	}
	return s.cfg.TTL
}

// ClaimTx implements dedupe.Store: it claims req.Key in the caller's
// transaction with one statement (two when it had to wait for a concurrent
// claim of the same key). The key is written COMPLETED at once: nothing
// outside tx can see it before tx commits, and a rollback removes it.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, req dedupe.Request) (dedupe.Claim, error) {
	if tx == nil {
		return dedupe.Claim{}, errors.New("pgstore: ClaimTx: tx is nil")
	}
	return s.claim(ctx, tx, req, dedupe.StatusCompleted, 0)
}

func (s *Store) checkResult(result []byte) error {
	if len(result) > s.cfg.MaxResultBytes {
		return &dedupe.ResultTooLargeError{Size: len(result), Limit: s.cfg.MaxResultBytes}
	}
	return nil
}

// CompleteTx implements dedupe.Store. A nil result costs no statement, since
// ClaimTx already wrote the key as COMPLETED; a non-nil one costs one UPDATE.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, c dedupe.Claim, result []byte) error {
	if err := s.checkResult(result); err != nil {
		return err
	}
	if !c.Decision.Run() {
		return fmt.Errorf("pgstore: CompleteTx of %s: the claim's decision is %v, not one that runs the handler", c.Record.Key, c.Decision)
	}
	if result == nil {
		return nil
	}
	n, err := s.l.update(ctx, tx, c.Record.Key, keyUpdate{op: updateResult, result: result})
	if err != nil {
		return classify("complete "+c.Record.Key.String(), err)
	}
	if n != 1 {
		return fmt.Errorf("pgstore: complete %s: key not claimed in this transaction", c.Record.Key)
	}
	return nil
}

// Acquire implements dedupe.Store: one committed statement claims the key
// as PROCESSING until now+lease.
func (s *Store) Acquire(ctx context.Context, req dedupe.Request, lease time.Duration) (dedupe.Claim, error) {
	if lease <= 0 {
		return dedupe.Claim{}, fmt.Errorf("pgstore: Acquire: lease is %v: set a positive duration", lease)
	}
	return s.claim(ctx, s.pool, req, dedupe.StatusProcessing, lease)
}

// Complete implements dedupe.Store. The key is kept for the claim's TTL
// (the Request's, as Acquire had it), or the store's.
func (s *Store) Complete(ctx context.Context, c dedupe.Claim, result []byte) error {
	if err := s.checkResult(result); err != nil {
		return err
	}
	k := c.Record.Key
	ttl := micros(s.ttl(dedupe.Request{TTL: c.TTL}))
	n, err := s.l.update(ctx, s.pool, k, keyUpdate{op: updateComplete, attempts: c.Record.Attempts, result: result, ttlMicros: ttl})
	if err != nil {
		return classify("complete "+k.String(), err)
	}
	if n == 0 {
		return fmt.Errorf("pgstore: complete %s (attempt %d): %w", k, c.Record.Attempts, dedupe.ErrLeaseLost)
	}
	return nil
}

// Release implements dedupe.Store.
func (s *Store) Release(ctx context.Context, c dedupe.Claim) error {
	k := c.Record.Key
	n, err := s.l.update(ctx, s.pool, k, keyUpdate{op: updateRelease, attempts: c.Record.Attempts})
	if err != nil {
		return classify("release "+k.String(), err)
	}
	if n == 0 {
		return fmt.Errorf("pgstore: release %s (attempt %d): %w", k, c.Record.Attempts, dedupe.ErrLeaseLost)
	}
	return nil
}

// Extend moves the end of c's lease to now+lease, if the lease is still
// c's (not released, completed or taken over): else an error wrapping
// dedupe.ErrLeaseLost. DoLease extends its leases while its function runs.
func (s *Store) Extend(ctx context.Context, c dedupe.Claim, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("pgstore: Extend: lease is %v: set a positive duration", lease)
	}
	k := c.Record.Key
	n, err := s.l.update(ctx, s.pool, k, keyUpdate{op: updateExtend, attempts: c.Record.Attempts, leaseMicros: micros(lease)})
	if err != nil {
		return classify("extend "+k.String(), err)
	}
	if n == 0 {
		return fmt.Errorf("pgstore: extend %s (attempt %d): %w", k, c.Record.Attempts, dedupe.ErrLeaseLost)
	}
	return nil
}

// Check verifies that the store's table exists where Config.Schema and
// Config.Table say, with the columns the migrations create. Call it at
// start-up: a missing table is a configuration error (an error wrapping
// dedupe.ErrMisconfigured that names the fix), and every message would
// otherwise fail with it.
//
// For LayoutPartitioned, Check also creates the time partitions when there
// are none yet, as Cleanup does. For LayoutSingleTable it returns an error
// wrapping ErrSingleTableClosed once the partitioned layout has started on the
// schema.
//
// Check also looks at how the pool connects: behind a connection pooler
// (PgBouncer, a managed proxy), which may run in transaction mode, a pool
// whose pgx QueryExecMode keeps statements on the server
// between round trips (cache_statement, pgx's default, and describe_exec)
// cannot work, and Check returns an error wrapping dedupe.ErrMisconfigured
// that names the modes that do (docs/deployments.md, "Behind a connection
// pooler").
func (s *Store) Check(ctx context.Context) error {
	info, err := s.poolerInfo(ctx)
	if err != nil {
		return classify("check the connection", err)
	}
	if err := pooler.CheckExecMode("pgstore: check "+s.table, s.pool, info); err != nil {
		return fmt.Errorf("%w (%w)", err, dedupe.ErrMisconfigured)
	}
	return s.l.check(ctx)
}

// CheckMaintenance reports whether the store's role can run Cleanup: an
// error wrapping dedupe.ErrMisconfigured that names the missing right, or
// nil. On the single-table layout Cleanup deletes expired keys (DELETE on the
// table); on the partitioned layout it also creates, attaches, detaches and
// drops partitions and moves the layout's state, which needs the role to
// own the key table (or be a member of its owner), CREATE on its schema and
// UPDATE on the state table. A role without them would fail every clean-up
// run while the partitions created ahead run out, and then every claim.
// Call it where clean-up runs (a worker does, at start, unless its
// clean-up runs elsewhere).
func (s *Store) CheckMaintenance(ctx context.Context) error {
	var role string
	var r maintenanceRights
	err := s.pool.QueryRow(ctx, `SELECT current_user, has_table_privilege($1::regclass, 'DELETE'),
       pg_has_role(c.relowner, 'USAGE'), has_schema_privilege(c.relnamespace, 'CREATE'),
       has_table_privilege($2::regclass, 'UPDATE')
FROM pg_class c WHERE c.oid = $1::regclass`, s.table, s.l.stateTable()).Scan(&role, &r.delete, &r.owns, &r.create, &r.state)
	if err != nil {
		return classify("check the maintenance rights on "+s.table, err)
	}
	var missing []string
	if !r.delete {
		missing = append(missing, "DELETE on "+s.table)
	}
	missing = append(missing, s.l.missingRights(r)...)
	if len(missing) > 0 {
		return fmt.Errorf("pgstore: role %q cannot run the key clean-up of the %s layout: it lacks %s: run the clean-up "+
			"(Store.RunCleanup) as the role that owns the tables: %w", role, s.cfg.Layout, strings.Join(missing, ", "), dedupe.ErrMisconfigured)
	}
	return nil
}

// Get implements dedupe.Store.
func (s *Store) Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error) {
	return s.GetTx(ctx, s.pool, key)
}

// GetTx is Get on db (a transaction sees its own uncommitted keys).
func (s *Store) GetTx(ctx context.Context, db DBTX, key dedupe.Key) (dedupe.Record, error) {
	row, err := s.l.get(ctx, db, key)
	if err != nil {
		return dedupe.Record{}, classify("get "+key.String(), err)
	}
	if !row.found {
		return dedupe.Record{}, fmt.Errorf("pgstore: get %s: %w", key, dedupe.ErrNotFound)
	}
	return row.rec, nil
}

// TryLockKeyTx takes key's lock in tx without waiting, and reports whether
// it took it: false when another transaction holds it. The lock is held
// until tx ends. A claim does not take it: it keeps apart the callers that
// take it before they claim (httpkey's requests in transactional mode), so
// that one that finds it taken answers at once instead of waiting for the
// transaction that holds the key's claim. It is a transaction-scoped
// advisory lock named by the store's table and the key.
func (s *Store) TryLockKeyTx(ctx context.Context, tx pgx.Tx, key dedupe.Key) (bool, error) {
	var locked bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.keyLockID(key)).Scan(&locked); err != nil {
		return false, fmt.Errorf("pgstore: lock %s: %w", key, err)
	}
	return locked, nil
}

// keyLockID is the advisory lock of key that TryLockKeyTx and
// BeginLockClaimTx take: the name httpkey took the lock under when it took
// it itself, so that two versions of a server in one rolling upgrade keep
// each other out.
func (s *Store) keyLockID(key dedupe.Key) int64 {
	return advisory.LockID("httpkey/" + s.cfg.Schema + "." + s.cfg.Table + "/" + key.Scope + "\x00" + key.ID)
}

// MaxResultBytes is the largest result the store keeps with a key
// (Config.MaxResultBytes).
func (s *Store) MaxResultBytes() int { return s.cfg.MaxResultBytes }

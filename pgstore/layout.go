package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactly-go/exactly/dedupe"
)

// Layout is how a Store keeps its keys.
type Layout int

const (
	// LayoutPartitioned, the default, keeps keys compact (the ID as 16
	// bytes when it is a UUID or a ULID, a 32-byte fingerprint, small codes
	// for scope, topic and status) in a table range-partitioned on the ID
	// (exactly_keys2, migration 00007). Keys with time-ordered IDs (UUIDv7,
	// ULID) go to the time partition of their mint time, which Cleanup
	// creates ahead and drops whole once every key in it is past its TTL;
	// any other ID goes to one partition retired by DELETE. A deployment's
	// single table (exactly_keys) serves as its oldest generation until its
	// keys expire: claims look there first, and nothing is copied. See
	// docs/keys.md.
	LayoutPartitioned Layout = iota
	// LayoutSingleTable keeps every key in one table (exactly_keys,
	// migration 00001): text columns, retired by DELETE and VACUUM. For a
	// deployment that has not switched yet (docs/upgrading.md); once a store
	// of the partitioned layout ran on the schema, a store of this one is
	// refused ([ErrSingleTableClosed]).
	LayoutSingleTable
)

// LayoutLegacy is LayoutSingleTable.
//
// Deprecated: use LayoutSingleTable.
const LayoutLegacy = LayoutSingleTable

func (l Layout) String() string {
	switch l {
	case LayoutSingleTable:
		return "single-table"
	case LayoutPartitioned:
		return "partitioned"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// layout is how a Store's statements reach its keys: one implementation per
// Layout, each with its own statements (singleTable, layout_single*.go;
// partitioned, layout_partitioned*.go). The protocol above it (claim.go,
// batch*.go, store.go, stats.go) is written once: the statements of both
// answer in the same columns (keyRow, scanned by scanKeyRow).
type layout interface {
	// prepareClaim returns a (validated, built from req) completed with
	// the layout's part: its statements and how it stores the key, read on
	// db (the pool, or the connection or transaction the caller holds).
	// Claim arguments go by value, so that they stay on the stack.
	prepareClaim(ctx context.Context, db DBTX, req dedupe.Request, a claimArgs) (claimArgs, error)
	// claimParams, lockParams and takeoverParams are the arguments of a's
	// claim, lock and takeover statements (a.q); takeover is fenced by the
	// attempts count read.
	claimParams(a claimArgs) []any
	lockParams(a claimArgs) []any
	takeoverParams(a claimArgs, attempts int) []any
	// claimError classifies the error of one of a's statements.
	claimError(req dedupe.Request, a claimArgs, err error) error

	// prepareBatch readies what DoBatch needs before its first transaction
	// takes a connection; beforeBatchTx, what each attempt needs.
	prepareBatch(ctx context.Context, reqs []dedupe.Request) error
	beforeBatchTx(ctx context.Context) error
	// batchStmts are the batch statements for the keys of reqs at order
	// (sorted by key, distinct, valid): a key refused on its own gets its
	// error in out, and the keys to claim one at a time (claim) are
	// returned in alone. A read it sends in tx first takes the BEGIN
	// (begin): stillBegin says whether the claim statement must send it.
	batchStmts(ctx context.Context, tx pgx.Tx, reqs []dedupe.Request, order []int, out []BatchClaim,
		begin bool) (st batchStmts, alone []int, stillBegin bool, err error)
	// storeResults stores the results of keys claimed in tx (the keys
	// scopes[j], ids[j] get blobs[j]) in one statement, and returns how
	// many keys it updated; its errors are classified.
	storeResults(ctx context.Context, tx pgx.Tx, scopes, ids []string, blobs [][]byte) (int64, error)
	// layoutError classifies the error of a batch statement.
	layoutError(op string, err error) error

	// update runs u on the stored key and returns how many rows it changed.
	update(ctx context.Context, db DBTX, key dedupe.Key, u keyUpdate) (int64, error)
	// get reads the stored key on db.
	get(ctx context.Context, db DBTX, key dedupe.Key) (keyRow, error)
	// resultOne is the statement (and its arguments, read on db) that
	// stores result with key, claimed in the same transaction, and fails
	// with notOneRow unless it updated exactly one row (queries.resultOne).
	resultOne(ctx context.Context, db DBTX, key dedupe.Key, result []byte) (string, []any, error)
	// stats counts (or estimates) the keys, on db.
	stats(ctx context.Context, db DBTX) (dedupe.Stats, error)
	// cleanup runs the layout's maintenance on conn, which holds the
	// clean-up lock, and returns about how many keys it retired and the
	// statement that deletes one batch ($1 keys at most) of expired keys.
	cleanup(ctx context.Context, conn *pgxpool.Conn) (retired int64, deleteSQL string, err error)
	// check checks the layout's tables (Store.Check).
	check(ctx context.Context) error
	// stateTable is the table whose UPDATE the clean-up needs; missingRights,
	// the rights besides DELETE on the keys that the role r lacks.
	stateTable() string
	missingRights(r maintenanceRights) []string
}

// queries are a layout's statements on one key.
type queries struct {
	claim, lock, takeover, result, complete, release, extend, get, cleanup string
	// claimNew is claim that only inserts: a stored key returns nothing,
	// and the caller reads it with lock, one round trip more. It saves a
	// new key the executor's start of claim's read of the stored row, for
	// a caller whose keys are new in all but rare retries and that holds
	// the key's lock, so that no other claim of the key waits on the row
	// lock that lock takes (BeginLockClaimTx).
	claimNew string
	// resultOne is result that fails unless it updated exactly one row
	// (oneRowSQL), for a statement sent in one round trip with the COMMIT.
	resultOne string
	// batchResult stores the results of many keys (the partitioned layout's).
	batchResult string
	// positional lists the names of the arguments of each statement above
	// that the partitioned layout numbered (numberArgs), by its text.
	positional map[string][]string
}

// keyUpdate is an update of one stored key: the result of a key claimed in
// the caller's transaction, or the completion or release of a lease fenced
// by its attempts count.
type keyUpdate struct {
	op       updateOp
	attempts int
	result   []byte
	// leaseMicros is the extended lease from now, in microseconds.
	leaseMicros float64
	// ttlMicros is the key's TTL from the completion, in microseconds.
	ttlMicros float64
}

type updateOp int

const (
	updateResult updateOp = iota
	updateComplete
	updateRelease
	updateExtend
)

// maintenanceRights are what CheckMaintenance read of the store's role.
type maintenanceRights struct {
	// delete: DELETE on the keys; owns: membership in the key table's owner
	// role; create: CREATE on its schema; state: UPDATE on stateTable.
	delete, owns, create, state bool
}

package dedupe

import (
	"context"
	"time"
)

// DefaultTTL is how long a completed key is kept: 7 days, Kafka's default
// retention.ms. A key must outlive every way its message can come back.
const DefaultTTL = 7 * 24 * time.Hour

// Request asks to claim a key.
type Request struct {
	Key         Key
	Fingerprint Fingerprint
	// Source is where the message came from; recorded, never compared.
	Source Source
	// TTL overrides the store's TTL for this key when positive.
	TTL time.Duration
}

// Validate checks the key and the fingerprint.
func (r Request) Validate() error {
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if !r.Fingerprint.Valid() {
		return &InvalidKeyError{Key: r.Key, Reason: "fingerprint is not 64 lowercase hex digits"}
	}
	return nil
}

// Claim is the answer to a claim: what to do, and the stored record.
type Claim struct {
	Decision Decision
	// Record is the key as stored after the claim. On DecisionDuplicate,
	// Record.Result is the result the first run stored.
	Record Record
	// TTL is the Request's TTL (0: the store's). Complete keeps the key for
	// it, as the claim did.
	TTL time.Duration
}

// BatchClaim is a batch store's answer for one request of a batch: all of
// a batch's keys are claimed in one transaction, and the handler runs once
// for the fresh ones (pgstore.Store.DoBatch).
type BatchClaim struct {
	// Claim is the claim's decision and the key's record: OutcomeNew or
	// OutcomeTakeover when the handler ran for it (Record.Result is then
	// the handler's result), DecisionDuplicate with the stored result
	// otherwise. Zero when Err is set.
	Claim
	// Err is the request's own failure, which neither ran the handler for
	// it nor failed the batch: an *InvalidKeyError, a *KeyReusedError
	// (permanent: for the dead-letter topic) or an *InFlightError (a
	// lease-mode claim holds the key: try again later).
	Err error
}

// Stats describes a store's table, for metrics. A store answers in
// constant time, whatever the number of keys: a large table's counts are
// estimates (Estimated).
type Stats struct {
	Processing int64
	Completed  int64
	// Expired counts keys past their expiry that cleanup has not deleted yet.
	Expired int64
	// Oldest is the creation time of the oldest key (of the key that expires
	// first, when Estimated); zero when empty.
	Oldest time.Time
	// TableBytes is the size on disk of the table and its indexes; 0 when unknown.
	TableBytes int64
	// Estimated reports that the counts are estimates (from the database's
	// statistics, as its planner has them) rather than exact counts: the
	// store has too many keys to count them on every call.
	Estimated bool
}

// CleanupConfig tunes one cleanup run.
type CleanupConfig struct {
	// BatchSize is how many keys one statement deletes. Defaults to 1000.
	BatchSize int
	// MaxBatches bounds the run; 0 means "until nothing expired is left".
	MaxBatches int
}

// Store keeps keys. TX is the type of the caller's transaction (pgx.Tx for
// pgstore). A Store is safe for concurrent use.
//
// Transactional mode (the default) runs ClaimTx, the handler's writes and
// CompleteTx in one transaction of the caller's: the key commits with the
// effects or rolls back with them, so no one ever sees it half done.
//
// Lease mode is for handlers whose effects leave the database: Acquire
// commits a PROCESSING key with a lease, the handler runs, then Complete or
// Release commits on its own. A crashed worker's key is taken over once its
// lease expires.
type Store[TX any] interface {
	// ClaimTx claims req.Key in tx. DecisionNew and DecisionTakeover mean run
	// the handler in tx, then CompleteTx and commit. A concurrent claim of the
	// same key waits until tx ends. Errors: *InvalidKeyError, *KeyReusedError,
	// *InFlightError (a lease-mode claim holds the key), or a RetryableError.
	ClaimTx(ctx context.Context, tx TX, req Request) (Claim, error)
	// CompleteTx stores result for a key claimed by ClaimTx in the same tx.
	// A nil result stores nothing and may cost nothing. ErrResultTooLarge
	// when result is over the store's limit.
	CompleteTx(ctx context.Context, tx TX, c Claim, result []byte) error

	// Acquire claims req.Key under a lease, committed at once.
	Acquire(ctx context.Context, req Request, lease time.Duration) (Claim, error)
	// Complete marks a key acquired by Acquire as completed with result.
	// ErrLeaseLost when the lease expired and another worker took it over.
	Complete(ctx context.Context, c Claim, result []byte) error
	// Release gives up a key acquired by Acquire after a failure, so the next
	// delivery takes it over at once (Attempts keeps counting).
	// ErrLeaseLost when another worker owns it now.
	Release(ctx context.Context, c Claim) error

	// Get returns the stored record for key, or ErrNotFound.
	Get(ctx context.Context, key Key) (Record, error)
	// Cleanup deletes expired keys (completed ones, and processing ones whose
	// lease has also expired) in bounded batches and returns how many it
	// deleted. Only one cleanup runs at a time: ErrCleanupBusy otherwise.
	Cleanup(ctx context.Context, cfg *CleanupConfig) (int64, error)
	// Stats describes the stored keys.
	Stats(ctx context.Context) (Stats, error)
}

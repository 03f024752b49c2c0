package dedupetest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/exactly-go/exactly/dedupe"
)

// MemStore is an in-memory dedupe.Store for unit tests of code that uses a
// Store. It follows the protocol of the Postgres store: a key claimed in an
// open transaction makes other claimers wait until that transaction ends.
// It keeps nothing across restarts, so it is no deduplication for production.
type MemStore struct {
	// MaxResultBytes bounds stored results. Defaults to 1 MiB.
	MaxResultBytes int
	// TTL of completed keys. Defaults to dedupe.DefaultTTL.
	TTL time.Duration
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time

	mu        sync.Mutex
	committed map[dedupe.Key]dedupe.Record
	locks     map[dedupe.Key]*memLock
	cleaning  bool
}

type memLock struct {
	owner *MemTx
	done  chan struct{}
}

// MemTx is a MemStore transaction.
type MemTx struct {
	s        *MemStore
	writes   map[dedupe.Key]dedupe.Record
	onCommit []func()
	ended    bool
}

var _ dedupe.Store[*MemTx] = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{committed: map[dedupe.Key]dedupe.Record{}, locks: map[dedupe.Key]*memLock{}}
}

var errTxDone = errors.New("dedupetest: transaction has already been committed or rolled back")

// Begin starts a transaction.
func (s *MemStore) Begin(context.Context) (*MemTx, error) {
	return &MemTx{s: s, writes: map[dedupe.Key]dedupe.Record{}}, nil
}

// OnCommit runs f when tx commits (tests use it for the handler's effects).
func (tx *MemTx) OnCommit(f func()) { tx.onCommit = append(tx.onCommit, f) }

// Commit makes tx's writes visible and wakes waiting claimers.
func (tx *MemTx) Commit(context.Context) error {
	s := tx.s
	s.mu.Lock()
	if tx.ended {
		s.mu.Unlock()
		return errTxDone
	}
	for k, r := range tx.writes {
		s.committed[k] = r
	}
	tx.end()
	s.mu.Unlock()
	for _, f := range tx.onCommit {
		f()
	}
	return nil
}

// Rollback drops tx's writes and wakes waiting claimers. It is a no-op on an
// ended transaction.
func (tx *MemTx) Rollback(context.Context) error {
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	if !tx.ended {
		tx.end()
	}
	return nil
}

// end releases tx's locks; s.mu must be held.
func (tx *MemTx) end() {
	tx.ended = true
	for k := range tx.writes {
		if l := tx.s.locks[k]; l != nil && l.owner == tx {
			close(l.done)
			delete(tx.s.locks, k)
		}
	}
}

func (s *MemStore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *MemStore) ttl(req dedupe.Request) time.Duration {
	switch {
	case req.TTL > 0:
		return req.TTL
	case s.TTL > 0:
		return s.TTL
	}
	return dedupe.DefaultTTL
}

func (s *MemStore) maxResult() int {
	if s.MaxResultBytes > 0 {
		return s.MaxResultBytes
	}
	return 1 << 20
}

// lockKey waits until no other transaction holds key, then returns with s.mu
// held. tx may be nil (an autocommit statement).
func (s *MemStore) lockKey(ctx context.Context, tx *MemTx, key dedupe.Key) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		l := s.locks[key]
		if l == nil || l.owner == tx {
			return nil
		}
		s.mu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lookup returns key as tx sees it; s.mu must be held.
func (s *MemStore) lookup(tx *MemTx, key dedupe.Key) (dedupe.Record, bool) {
	if tx != nil {
		if r, ok := tx.writes[key]; ok {
			return r, true
		}
	}
	r, ok := s.committed[key]
	return r, ok
}

// claim runs the protocol for tx (nil: lease mode, committed at once).
func (s *MemStore) claim(ctx context.Context, tx *MemTx, req dedupe.Request, lease time.Duration) (dedupe.Claim, error) {
	if err := req.Validate(); err != nil {
		return dedupe.Claim{}, err
	}
	if tx != nil && tx.ended {
		return dedupe.Claim{}, errTxDone
	}
	if err := s.lockKey(ctx, tx, req.Key); err != nil {
		return dedupe.Claim{}, err
	}
	defer s.mu.Unlock()
	now := s.now()
	rec, found := s.lookup(tx, req.Key)
	decision := dedupe.DecisionNew
	if found {
		var err error
		if decision, err = dedupe.Decide(rec, req.Fingerprint, now); err != nil || decision == dedupe.DecisionDuplicate {
			return dedupe.Claim{Decision: decision, Record: clone(rec), TTL: req.TTL}, err
		}
		rec.Attempts++
	} else {
		rec = dedupe.Record{Key: req.Key, Fingerprint: req.Fingerprint, Attempts: 1, CreatedAt: now}
	}
	rec.Source = req.Source
	rec.ExpiresAt = now.Add(s.ttl(req))
	if tx != nil {
		rec.Status, rec.CompletedAt, rec.LockedUntil = dedupe.StatusCompleted, now, time.Time{}
		tx.writes[req.Key] = rec
		s.locks[req.Key] = &memLock{owner: tx, done: make(chan struct{})}
	} else {
		rec.Status, rec.CompletedAt, rec.LockedUntil = dedupe.StatusProcessing, time.Time{}, now.Add(lease)
		s.committed[req.Key] = rec
	}
	return dedupe.Claim{Decision: decision, Record: clone(rec), TTL: req.TTL}, nil
}

// ClaimTx implements dedupe.Store.
func (s *MemStore) ClaimTx(ctx context.Context, tx *MemTx, req dedupe.Request) (dedupe.Claim, error) {
	if tx == nil {
		return dedupe.Claim{}, errors.New("dedupetest: ClaimTx needs a transaction")
	}
	return s.claim(ctx, tx, req, 0)
}

// CompleteTx implements dedupe.Store.
func (s *MemStore) CompleteTx(ctx context.Context, tx *MemTx, c dedupe.Claim, result []byte) error {
	if len(result) > s.maxResult() {
		return &dedupe.ResultTooLargeError{Size: len(result), Limit: s.maxResult()}
	}
	if err := s.lockKey(ctx, tx, c.Record.Key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rec, ok := tx.writes[c.Record.Key]
	if !ok || tx.ended {
		return errors.New("dedupetest: CompleteTx of a key not claimed in this transaction")
	}
	rec.Result = bytes.Clone(result)
	tx.writes[c.Record.Key] = rec
	return nil
}

// Acquire implements dedupe.Store.
func (s *MemStore) Acquire(ctx context.Context, req dedupe.Request, lease time.Duration) (dedupe.Claim, error) {
	if lease <= 0 {
		return dedupe.Claim{}, errors.New("dedupetest: lease must be positive")
	}
	return s.claim(ctx, nil, req, lease)
}

// owned returns the committed record if c still owns its lease; s.mu held.
func (s *MemStore) owned(c dedupe.Claim) (dedupe.Record, error) {
	rec, ok := s.committed[c.Record.Key]
	if !ok || rec.Status != dedupe.StatusProcessing || rec.Attempts != c.Record.Attempts {
		return rec, dedupe.ErrLeaseLost
	}
	return rec, nil
}

// Complete implements dedupe.Store.
func (s *MemStore) Complete(ctx context.Context, c dedupe.Claim, result []byte) error {
	if len(result) > s.maxResult() {
		return &dedupe.ResultTooLargeError{Size: len(result), Limit: s.maxResult()}
	}
	if err := s.lockKey(ctx, nil, c.Record.Key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rec, err := s.owned(c)
	if err != nil {
		return err
	}
	now := s.now()
	rec.Status, rec.CompletedAt, rec.LockedUntil = dedupe.StatusCompleted, now, time.Time{}
	rec.Result = bytes.Clone(result)
	rec.ExpiresAt = now.Add(s.ttl(dedupe.Request{TTL: c.TTL}))
	s.committed[c.Record.Key] = rec
	return nil
}

// Release implements dedupe.Store.
func (s *MemStore) Release(ctx context.Context, c dedupe.Claim) error {
	if err := s.lockKey(ctx, nil, c.Record.Key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rec, err := s.owned(c)
	if err != nil {
		return err
	}
	rec.LockedUntil = s.now()
	s.committed[c.Record.Key] = rec
	return nil
}

// Get implements dedupe.Store.
func (s *MemStore) Get(ctx context.Context, key dedupe.Key) (dedupe.Record, error) {
	if err := ctx.Err(); err != nil {
		return dedupe.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.committed[key]
	if !ok {
		return dedupe.Record{}, dedupe.ErrNotFound
	}
	return clone(rec), nil
}

func expired(r dedupe.Record, now time.Time) bool {
	return r.ExpiresAt.Before(now) && (r.Status == dedupe.StatusCompleted || r.LockedUntil.Before(now))
}

// Cleanup implements dedupe.Store.
func (s *MemStore) Cleanup(ctx context.Context, cfg *dedupe.CleanupConfig) (int64, error) {
	s.mu.Lock()
	if s.cleaning {
		s.mu.Unlock()
		return 0, dedupe.ErrCleanupBusy
	}
	s.cleaning = true
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.cleaning = false; s.mu.Unlock() }()

	batch, maxBatches := 1000, 0
	if cfg != nil {
		if cfg.BatchSize > 0 {
			batch = cfg.BatchSize
		}
		maxBatches = cfg.MaxBatches
	}
	var total int64
	for n := 0; maxBatches == 0 || n < maxBatches; n++ {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		s.mu.Lock()
		now, deleted := s.now(), 0
		for k, r := range s.committed {
			if deleted == batch {
				break
			}
			if s.locks[k] == nil && expired(r, now) {
				delete(s.committed, k)
				deleted++
			}
		}
		s.mu.Unlock()
		total += int64(deleted)
		if deleted < batch {
			break
		}
	}
	return total, nil
}

// Stats implements dedupe.Store.
func (s *MemStore) Stats(ctx context.Context) (dedupe.Stats, error) {
	if err := ctx.Err(); err != nil {
		return dedupe.Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var st dedupe.Stats
	now := s.now()
	for _, r := range s.committed {
		switch r.Status {
		case dedupe.StatusProcessing:
			st.Processing++
		case dedupe.StatusCompleted:
			st.Completed++
		}
		if r.ExpiresAt.Before(now) {
			st.Expired++
		}
		if st.Oldest.IsZero() || r.CreatedAt.Before(st.Oldest) {
			st.Oldest = r.CreatedAt
		}
	}
	return st, nil
}

func clone(r dedupe.Record) dedupe.Record {
	if r.Result != nil {
		r.Result = append([]byte{}, r.Result...)
	}
	return r
}

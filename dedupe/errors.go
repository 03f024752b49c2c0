package dedupe

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is; the typed errors below wrap them.
var (
	// ErrInvalidKey: the key is empty, too long or has bad characters.
	ErrInvalidKey = errors.New("dedupe: invalid key")
	// ErrKeyReused: the key is already bound to another payload.
	ErrKeyReused = errors.New("dedupe: key reused with a different payload")
	// ErrInFlight: another worker holds a valid lease on the key.
	ErrInFlight = errors.New("dedupe: key in flight")
	// ErrInvalidPayload: the payload cannot be fingerprinted (not JSON for JSONFingerprint).
	ErrInvalidPayload = errors.New("dedupe: invalid payload")
	// ErrResultTooLarge: the result to store is over the store's limit.
	ErrResultTooLarge = errors.New("dedupe: result too large")
	// ErrLeaseLost: the lease expired and another worker took the key over
	// (or the claim was released) before Complete or Release.
	ErrLeaseLost = errors.New("dedupe: lease lost")
	// ErrNotFound: no record for the key.
	ErrNotFound = errors.New("dedupe: key not found")
	// ErrCleanupBusy: another cleanup of the same table is running.
	ErrCleanupBusy = errors.New("dedupe: another cleanup is running")
	// ErrPoisonMessage: a message failed, because of itself, on every one of
	// a bounded number of attempts (its handler panics on it, or returns an
	// error every time while the database answers). It is permanent: it
	// belongs on a dead-letter topic, with the last error, so that the
	// messages after it are not held up.
	ErrPoisonMessage = errors.New("dedupe: poison message: it failed on every attempt")
	// ErrMisconfigured: the deployment, not the message, is wrong (a table
	// that does not exist, a scope shared by two handlers, a misordered
	// middleware chain). It is neither permanent nor transient: the message
	// must not be dead-lettered, and retrying cannot help until the
	// configuration is fixed; the error says how.
	ErrMisconfigured = errors.New("dedupe: misconfigured")
)

// InvalidKeyError reports a key that cannot be stored. It is permanent.
type InvalidKeyError struct {
	Key    Key
	Reason string
}

func (e *InvalidKeyError) Error() string {
	return fmt.Sprintf("dedupe: invalid key %q: %s", truncate(e.Key.String(), 80), e.Reason)
}

// Unwrap returns ErrInvalidKey.
func (e *InvalidKeyError) Unwrap() error { return ErrInvalidKey }

// KeyReusedError reports a key that arrived with another payload than the one
// that first claimed it. The new payload is never applied. It is permanent:
// retrying cannot succeed, so it belongs on a dead-letter topic.
type KeyReusedError struct {
	Key Key
	// Stored is the fingerprint the key is bound to.
	Stored Fingerprint
	// Got is the fingerprint of the payload that reused the key.
	Got Fingerprint
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("dedupe: key %s reused with a different payload: stored fingerprint %s, got %s",
		e.Key, e.Stored, e.Got)
}

// Unwrap returns ErrKeyReused.
func (e *KeyReusedError) Unwrap() error { return ErrKeyReused }

// InFlightError reports a key that another worker is processing under a
// lease (lease mode). It is retryable: try again after LockedUntil.
type InFlightError struct {
	Key         Key
	LockedUntil time.Time
	Attempts    int
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("dedupe: key %s in flight (attempt %d, lease until %s)",
		e.Key, e.Attempts, e.LockedUntil.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrInFlight.
func (e *InFlightError) Unwrap() error { return ErrInFlight }

// ResultTooLargeError reports a result over the store's limit. It is
// permanent: the same handler would produce the same result again.
type ResultTooLargeError struct {
	Size, Limit int
}

func (e *ResultTooLargeError) Error() string {
	return fmt.Sprintf("dedupe: result of %d bytes is over the limit of %d bytes", e.Size, e.Limit)
}

// Unwrap returns ErrResultTooLarge.
func (e *ResultTooLargeError) Unwrap() error { return ErrResultTooLarge }

// RetryableError marks a transient failure (a serialisation failure, a
// deadlock, a lost connection): the same work may succeed if run again.
type RetryableError struct{ Err error }

func (e *RetryableError) Error() string { return e.Err.Error() }

// Unwrap returns the transient error.
func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable marks err as transient. Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &RetryableError{Err: err}
}

// IsRetryable reports whether running the same work again may succeed:
// the key is in flight, or err was marked with Retryable.
func IsRetryable(err error) bool {
	var r *RetryableError
	return errors.Is(err, ErrInFlight) || errors.As(err, &r)
}

// PermanentError marks a failure that is the message's own and that no
// retry can fix: a handler's validation error (an amount below zero, an
// account that does not exist). It is permanent: the message belongs on a
// dead-letter topic, with Err as the reason.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the handler's error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as the message's own failure, which no retry can fix:
// the counterpart of [Retryable]. A handler returns it for a message it
// rejects (a command that fails validation), so that it is dead-lettered
// with err as its reason at once, never retried. Permanent(nil) is nil.
//
//	if cmd.Amount <= 0 {
//		return nil, dedupe.Permanent(fmt.Errorf("amount %d: want > 0", cmd.Amount))
//	}
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err can never succeed on a retry: an invalid
// key, a reused key, an invalid payload, a result over the limit, a poison
// message, or an error marked with [Permanent]. A router should send such a
// message to its dead-letter topic instead of retrying. A configuration
// error (ErrMisconfigured) is never permanent, whatever it wraps or however
// it is marked: the message is not at fault.
func IsPermanent(err error) bool {
	if errors.Is(err, ErrMisconfigured) {
		return false
	}
	var p *PermanentError
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrKeyReused) ||
		errors.Is(err, ErrInvalidPayload) || errors.Is(err, ErrResultTooLarge) ||
		errors.Is(err, ErrPoisonMessage) || errors.As(err, &p)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

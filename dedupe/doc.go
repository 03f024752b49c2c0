// Package dedupe is the core of exactly: what a message's idempotency key
// is, how a payload is fingerprinted, what a stored key looks like, and
// what to do when a key is already there. It imports only the standard
// library; [github.com/exactly-go/exactly/pgstore] implements its [Store]
// on Postgres, and [github.com/exactly-go/exactly/dedupe/dedupetest] holds
// the conformance suite and an in-memory Store.
//
//	key, err := dedupe.NewKey("ledger-consumer", msg.UUID) // scope = the handler's stable name
//	fp := dedupe.FingerprintOf(msg.Payload)                 // or dedupe.JSONFingerprint for unstable JSON
//
//	decision, err := dedupe.Decide(stored, fp, now)
//	// DecisionDuplicate: skip the handler, return stored.Result
//	// *KeyReusedError:   same key, other payload — permanent, dead-letter it
//	// *InFlightError:    another worker holds the lease — retry later
//	// DecisionTakeover:  the lease expired — run the handler again
//
// Errors are classified for routers: [IsPermanent] (never retry: dead-letter;
// a poison message, [ErrPoisonMessage], is one, and a handler marks its own
// validation errors with [Permanent]), [IsRetryable] (try again later; a
// handler marks a dependency's outage with [Retryable]), and
// [ErrMisconfigured] (the deployment is wrong: neither, until it is fixed).
package dedupe

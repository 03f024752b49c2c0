// Package ledgertest runs the replay tool against the ledger example's
// worker and workload: verify, rewind and their failures on a consumer with
// and without dedupe. It is a module of its own, never published, so that
// the replay tool's module requires the library alone and a user who
// installs it downloads neither the example nor its dependencies.
package ledgertest

// Package dbloss holds the tests of a Postgres that loses its last commits
// while Kafka's committed offsets are ahead of them: an asynchronous
// streaming standby promoted after its primary was killed, and a restore of
// a base backup taken mid-stream. Each runs ledgers in three modes
// (per message, key-ordered, batch), with and without positions kept in
// Postgres (pgstore.Positions), against PostgreSQL 15 clusters of its own
// and a real Kafka broker; without positions the lost commits stay lost,
// with them every command is applied exactly once.
//
// The clusters (package pgcluster) run as the postgres user from
// /usr/lib/postgresql/15/bin on free ports; without root or those binaries
// the tests skip (and fail under CI=true).
package dbloss

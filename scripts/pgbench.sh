#!/usr/bin/env bash
# Server-side costs, measured with pgbench (no Go in the loop). Each round
# runs a baseline transaction and the transaction under test for the same
# time, one after the other, and prints the throughput ratio.
#
#   scripts/pgbench.sh claim  [rounds] [seconds] [clients]
#       plain (BEGIN, UPDATE, COMMIT) against the same with pgstore's claim,
#       BEGIN and the claim pipelined as Store.Do sends them. Compare with
#       `go test -run '^$' -bench MessageTxRatio ./pgstore` to see what the
#       client adds.
#   scripts/pgbench.sh notify [rounds] [seconds] [clients]
#       a producer writing one outbox row: with the NOTIFY trigger disabled,
#       against the migration's trigger while a relay is registered as
#       sleeping (every commit notifies) and while none is (the relays are
#       busy: commits do not notify).
#
# DATABASE_URL (or TEST_DATABASE_URL) names the server; defaults: 5 rounds of
# 10 s with 2 clients.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${DATABASE_URL:-${TEST_DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/exactly_test?sslmode=disable}}
what=${1:-} rounds=${2:-5} secs=${3:-10} clients=${4:-2}
case "$what" in
claim | notify) ;;
*) echo "usage: $0 claim|notify [rounds] [seconds] [clients]" >&2; exit 2 ;;
esac
command -v pgbench >/dev/null || { echo "pgbench.sh: pgbench is not installed (apt-get install postgresql-client)" >&2; exit 1; }

psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null <<'SQL'
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS exactly_pgbench CASCADE;
CREATE SCHEMA exactly_pgbench;
CREATE TABLE exactly_pgbench.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO exactly_pgbench.accounts SELECT g, 0 FROM generate_series(0, 999) g;
SQL
trap 'psql -q "$url" -c "DROP SCHEMA IF EXISTS exactly_pgbench CASCADE" >/dev/null 2>&1 || true' EXIT
# The tables exactly as the migrations make them, in the scratch schema.
for f in "$here"/../migrations/sql/*.sql; do
	sed -n '/-- +goose Up/,/-- +goose Down/p' "$f" | grep -v '^-- +goose'
done | { echo 'SET search_path = exactly_pgbench;'; cat; } |
	psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null

tps() {
	pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f "$here/pgbench/$1.sql" "$url" 2>&1 |
		sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
sql() { psql -q -v ON_ERROR_STOP=1 "$url" -c "$1" >/dev/null; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f tps, ratio %.3f", a, a / b }'; }
round_claim() {
	local plain claim
	plain=$(tps plain)
	claim=$(tps claim)
	echo "round $1: plain $(printf %.0f "$plain") tps; with the claim $(ratio "$claim" "$plain")"
}
round_notify() {
	local quiet sleeping busy
	sql "ALTER TABLE exactly_pgbench.exactly_outbox DISABLE TRIGGER exactly_outbox_notify"
	quiet=$(tps outbox)
	sql "ALTER TABLE exactly_pgbench.exactly_outbox ENABLE TRIGGER exactly_outbox_notify"
	sql "INSERT INTO exactly_pgbench.exactly_outbox_waiters VALUES ('pgbench', now() + interval '1 hour')"
	sleeping=$(tps outbox)
	sql "DELETE FROM exactly_pgbench.exactly_outbox_waiters"
	busy=$(tps outbox)
	echo "round $1: trigger disabled $(printf %.0f "$quiet") tps; relay sleeping (notify) $(ratio "$sleeping" "$quiet"); relay busy (no notify) $(ratio "$busy" "$quiet")"
}
for i in $(seq 1 "$rounds"); do "round_$what" "$i"; done

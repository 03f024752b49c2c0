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
#   scripts/pgbench.sh http [rounds] [seconds] [clients]
#       an HTTP handler's transaction (one INSERT) plain, with the least key
#       row a store could write for the request (http-least.sql), and with
#       the statements httpkey sends for a new key (http-keyed.sql), mixed
#       in one run; the ratios are of mean latencies. Compare
#       with `go test -run X -bench Middleware/interleaved ./httpkey` (one
#       connection: pass 1 client) to see what the client adds.
#
# DATABASE_URL (or TEST_DATABASE_URL) names the server; defaults: 5 rounds of
# 10 s with 2 clients.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${DATABASE_URL:-${TEST_DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/exactly_test?sslmode=disable}}
what=${1:-} rounds=${2:-5} secs=${3:-10} clients=${4:-2}
case "$what" in
claim | notify | http) ;;
*) echo "usage: $0 claim|notify|http [rounds] [seconds] [clients]" >&2; exit 2 ;;
esac
command -v pgbench >/dev/null || { echo "pgbench.sh: pgbench is not installed (apt-get install postgresql-client)" >&2; exit 1; }

psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null <<'SQL'
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS exactly_pgbench CASCADE;
CREATE SCHEMA exactly_pgbench;
CREATE TABLE exactly_pgbench.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO exactly_pgbench.accounts SELECT g, 0 FROM generate_series(0, 999) g;
CREATE TABLE exactly_pgbench.payments (id bigserial PRIMARY KEY, amount bigint NOT NULL);
CREATE TABLE exactly_pgbench.least_keys (scope smallint, kid uuid, fingerprint bytea NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, kid));
SQL
trap 'psql -q "$url" -c "DROP SCHEMA IF EXISTS exactly_pgbench CASCADE" >/dev/null 2>&1 || true' EXIT
# The tables exactly as the migrations make them, in the scratch schema.
for f in "$here"/../migrations/sql/*.sql; do
	sed -n '/-- +goose Up/,/-- +goose Down/p' "$f" | grep -v '^-- +goose'
done | { echo 'SET search_path = exactly_pgbench;'; cat; } |
	psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null
# The scope of http-keyed.sql's keys, code 1 (the first a name gets).
if [ "$what" = http ]; then
	code=$(psql -XAt -q -v ON_ERROR_STOP=1 "$url" -c "INSERT INTO exactly_pgbench.exactly_key_names (name) VALUES ('http') RETURNING code")
	[ "$code" = 1 ] || { echo "pgbench.sh: the scope of http-keyed.sql got code $code, not 1" >&2; exit 1; }
fi

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
# The three HTTP transactions in one run, each transaction one of them
# picked at random, so that all three see the same load; the ratios are of
# their mean latencies (the plain one's over the other's).
round_http() {
	local lat
	lat=$(pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f "$here/pgbench/http-plain.sql@1" \
		-f "$here/pgbench/http-least.sql@1" -f "$here/pgbench/http-keyed.sql@1" "$url" 2>&1 |
		sed -n 's/^ - latency average = \([0-9.]*\) ms$/\1/p' | tr '\n' ' ')
	set -- "$1" $lat
	[ $# -eq 4 ] || { echo "pgbench.sh: round $1: no latency for each script" >&2; exit 1; }
	awk -v r="$1" -v p="$2" -v l="$3" -v k="$4" 'BEGIN { printf "round %s: plain %.3f ms; with the least key row %.3f ms, ratio %.3f; with httpkey'"'"'s statements %.3f ms, ratio %.3f\n", r, p, l, p / l, k, p / k }'
}
for i in $(seq 1 "$rounds"); do "round_$what" "$i"; done

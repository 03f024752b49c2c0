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
#       a producer writing one outbox row, on a table without the NOTIFY
#       trigger against the migration's table while a relay is registered
#       as sleeping (every commit notifies) and while none is (the relay is
#       busy: commits do not notify).
#
# DATABASE_URL (or TEST_DATABASE_URL) names the server; defaults: 5 rounds of
# 10 s with 2 clients.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${DATABASE_URL:-${TEST_DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/exactly_test?sslmode=disable}}
what=${1:-} rounds=${2:-5} secs=${3:-10} clients=${4:-2}
case "$what" in
claim) base=plain test=claim ;;
notify) base=outbox-quiet test=outbox ;;
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
done | { echo 'SET search_path = exactly_pgbench;'; cat; echo 'CREATE TABLE outbox_quiet (LIKE exactly_outbox INCLUDING ALL);'; } |
	psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null

tps() {
	pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f "$here/pgbench/$1.sql" "$url" 2>&1 |
		sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
sql() { psql -q -v ON_ERROR_STOP=1 "$url" -c "$1" >/dev/null; }
for i in $(seq 1 "$rounds"); do
	b=$(tps "$base")
	if [ "$what" = notify ]; then
		sql "INSERT INTO exactly_pgbench.exactly_outbox_waiters VALUES ('pgbench', now() + interval '1 hour')"
		w=$(tps "$test")
		sql "DELETE FROM exactly_pgbench.exactly_outbox_waiters"
		t=$(tps "$test")
		awk -v b="$b" -v w="$w" -v t="$t" -v i="$i" \
			'BEGIN { printf "round %d: no trigger %.0f tps; relay sleeping (notify) %.0f tps, ratio %.3f; relay busy (no notify) %.0f tps, ratio %.3f\n", i, b, w, w / b, t, t / b }'
		continue
	fi
	t=$(tps "$test")
	awk -v b="$b" -v t="$t" -v i="$i" -v bn="$base" -v tn="$test" \
		'BEGIN { printf "round %d: %s %.0f tps, %s %.0f tps, ratio %.3f\n", i, bn, b, tn, t, t / b }'
done

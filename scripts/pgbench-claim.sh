#!/usr/bin/env bash
# The server's side of pgstore's cost, without Go: pgbench runs a message's
# plain transaction and the same transaction with the claim, alternating, and
# prints the throughput ratio of each pair. Compare it with
# `go test -run '^$' -bench MessageTxRatio ./pgstore` to see what the client adds.
#
#   DATABASE_URL=postgres://... scripts/pgbench-claim.sh [rounds] [seconds] [clients]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${DATABASE_URL:-${TEST_DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/exactly_test?sslmode=disable}}
rounds=${1:-5} secs=${2:-10} clients=${3:-2}
command -v pgbench >/dev/null || { echo "pgbench-claim.sh: pgbench is not installed (apt-get install postgresql-client)" >&2; exit 1; }

psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null <<'SQL'
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS exactly_pgbench CASCADE;
CREATE SCHEMA exactly_pgbench;
CREATE TABLE exactly_pgbench.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO exactly_pgbench.accounts SELECT g, 0 FROM generate_series(0, 999) g;
SQL
# The key table exactly as the migrations make it.
sed -n '/-- +goose Up/,/-- +goose Down/p' "$here/../migrations/sql/00001_keys.sql" |
	sed -e 's/CREATE TABLE exactly_keys/CREATE TABLE exactly_pgbench.exactly_keys/' \
		-e 's/ON exactly_keys/ON exactly_pgbench.exactly_keys/' |
	psql -q -v ON_ERROR_STOP=1 "$url" >/dev/null
trap 'psql -q "$url" -c "DROP SCHEMA IF EXISTS exactly_pgbench CASCADE" >/dev/null 2>&1 || true' EXIT

tps() {
	pgbench -n -M prepared -c "$clients" -j "$clients" -T "$secs" -f "$here/pgbench/$1.sql" "$url" 2>&1 |
		sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
for i in $(seq 1 "$rounds"); do
	p=$(tps plain)
	c=$(tps claim)
	awk -v p="$p" -v c="$c" -v i="$i" 'BEGIN { printf "round %d: plain %.0f tps, with claim %.0f tps, ratio %.3f\n", i, p, c, c / p }'
done

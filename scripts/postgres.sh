#!/usr/bin/env bash
# Starts the machine's PostgreSQL server for tests and the demo, sets the
# postgres user's password and creates the test database.
#
#   scripts/postgres.sh start    start (or reuse) the server; print the URL
#   scripts/postgres.sh stop     stop a server that this script started
#   scripts/postgres.sh status
#
# It uses an installed Debian cluster (pg_ctlcluster, as on the CI machines).
# With Docker, `make up` runs the same server version from docker-compose.yml.
# A server this script starts allows PGMAXCONN clients (200); one that is
# already up keeps its own max_connections.
set -euo pipefail

PGVERSION=${PGVERSION:-15}
PGPORT=${PGPORT:-5432}
PGPASS=${PGPASSWORD:-postgres}
TESTDB=${TEST_DATABASE_NAME:-exactly_test}

as_postgres() {
	if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

ready() { pg_isready -q -h 127.0.0.1 -p "$PGPORT" 2>/dev/null; }

start() {
	# Only the URL goes to stdout: callers capture it. pg_ctlcluster, psql and
	# createdb talk on stdout too ("Removed stale pid file."), so they write
	# to stderr.
	prepare >&2
	echo "postgres://postgres:$PGPASS@127.0.0.1:$PGPORT/$TESTDB?sslmode=disable"
}

prepare() {
	if ! ready; then
		if ! command -v pg_ctlcluster >/dev/null; then
			echo "postgres.sh: PostgreSQL is not installed (no pg_ctlcluster)." >&2
			echo "  Install it (apt-get install postgresql-$PGVERSION), run 'make up' with Docker," >&2
			echo "  or point TEST_DATABASE_URL at a server." >&2
			exit 1
		fi
		if [ "$(id -u)" != 0 ] && [ "$(id -un)" != postgres ]; then
			echo "postgres.sh: starting the cluster needs root or the postgres user" >&2
			exit 1
		fi
		# Test binaries run side by side (go test -p, one per CPU), each with
		# a pool of its own next to the worker processes some tests start:
		# room for 200 clients (PGMAXCONN) rather than the default 100.
		pg_ctlcluster --skip-systemctl-redirect "$PGVERSION" main start -- -o "-c max_connections=${PGMAXCONN:-200}"
		for _ in $(seq 1 60); do ready && break; sleep 0.5; done
		ready || { echo "postgres.sh: server not ready on port $PGPORT within 30 s" >&2; tail -20 "/var/log/postgresql/postgresql-$PGVERSION-main.log" >&2 || true; exit 1; }
	fi
	if [ "$(id -u)" = 0 ] || [ "$(id -un)" = postgres ]; then
		as_postgres psql -q -p "$PGPORT" -v ON_ERROR_STOP=1 -c "ALTER USER postgres PASSWORD '$PGPASS'" >/dev/null
		if ! as_postgres psql -p "$PGPORT" -tAc "SELECT 1 FROM pg_database WHERE datname = '$TESTDB'" | grep -q 1; then
			as_postgres createdb -p "$PGPORT" "$TESTDB"
		fi
	fi
}

case "${1:-}" in
start) start ;;
stop) pg_ctlcluster --skip-systemctl-redirect "$PGVERSION" main stop ;;
status) if ready; then echo "postgres: up on port $PGPORT"; else echo "postgres: down"; exit 1; fi ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

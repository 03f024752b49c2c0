#!/usr/bin/env bash
# Runs PgBouncer, from Debian's package, in front of the test PostgreSQL, for
# the tests that run behind a connection pooler (make test-pooler).
#
#   scripts/pgbouncer.sh start    install the package when missing, write a
#                                 config, start (or reuse) the pooler; print the
#                                 URL to use (only the URL goes to stdout)
#   scripts/pgbouncer.sh stop     stop a pooler this script started
#   scripts/pgbouncer.sh status
#   scripts/pgbouncer.sh log      the pooler's log
#
# It runs an instance of its own (never Debian's system service), with its
# config, pid file and log in PGBOUNCER_RUN_DIR.
#
# Environment: TEST_DATABASE_URL (the server behind the pooler; defaults to
# what scripts/postgres.sh uses), PGBOUNCER_PORT (6432), PGBOUNCER_MODE
# (transaction, the default, or session), PGBOUNCER_POOL_SIZE (server
# connections per user and database, 40), PGBOUNCER_RUN_DIR
# (${TMPDIR:-/tmp}/exactly-pgbouncer-$PGBOUNCER_PORT).
#
# As most deployments are advised to, the pooler ignores the startup
# parameters it cannot keep (search_path, extra_float_digits): a client's
# search_path never reaches the server. Clients log in with their own role
# and password (SCRAM), looked up on the server as the postgres user.
set -euo pipefail

url=${TEST_DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/exactly_test?sslmode=disable}
port=${PGBOUNCER_PORT:-6432}
mode=${PGBOUNCER_MODE:-transaction}
size=${PGBOUNCER_POOL_SIZE:-40}
run=${PGBOUNCER_RUN_DIR:-${TMPDIR:-/tmp}/exactly-pgbouncer-$port}
pidfile=$run/pgbouncer.pid
logfile=$run/pgbouncer.log

die() { echo "pgbouncer.sh: $*" >&2; exit 1; }

case "$mode" in
transaction | session) ;;
*) die "PGBOUNCER_MODE is $mode: use transaction or session" ;;
esac

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install() {
	command -v pgbouncer >/dev/null && return 0
	[ -x /usr/sbin/pgbouncer ] && return 0
	[ "$(id -u)" = 0 ] || die "PgBouncer is not installed and installing it needs root: apt-get install pgbouncer"
	echo "pgbouncer.sh: installing Debian's pgbouncer package" >&2
	# The package would start Debian's own service on this port: a
	# policy-rc.d that says no keeps it from starting (as in containers).
	local policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod +x "$policy"
	fi
	local ok=0
	if apt-get install -y pgbouncer >&2 || { apt-get update >&2 && apt-get install -y pgbouncer >&2; }; then ok=1; fi
	if [ -n "$policy" ]; then rm -f "$policy"; fi
	[ "$ok" = 1 ] || die "apt-get install pgbouncer failed"
}

# parse TEST_DATABASE_URL: postgres://user:password@host:port/db?...
parse() {
	local rest=${url#*://}
	local auth=${rest%%@*}
	rest=${rest#*@}
	user=${auth%%:*}
	password=${auth#*:}
	local hostport=${rest%%/*}
	host=${hostport%%:*}
	sport=${hostport#*:}
	[ "$sport" = "$hostport" ] && sport=5432
	db=${rest#*/}
	db=${db%%\?*}
	[ -n "$user" ] && [ -n "$password" ] && [ -n "$db" ] || die "TEST_DATABASE_URL must name a user, a password and a database: $url"
}

start() {
	parse
	if running; then
		echo "postgres://$user:$password@127.0.0.1:$port/$db?sslmode=disable"
		return 0
	fi
	port_open "$port" && die "port $port is taken by another process: set PGBOUNCER_PORT"
	install
	local bin
	bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
	mkdir -p "$run"
	# PgBouncer refuses to run as root.
	if [ "$(id -u)" = 0 ]; then chown postgres "$run" 2>/dev/null || true; fi
	printf '"%s" "%s"\n' "$user" "$password" >"$run/userlist.txt"
	cat >"$run/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$sport

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = $mode
auth_type = scram-sha-256
auth_file = $run/userlist.txt
auth_user = $user
auth_query = SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = \$1
default_pool_size = $size
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,search_path
logfile = $logfile
pidfile = $pidfile
admin_users = $user
EOF
	if [ "$(id -u)" = 0 ]; then
		chown -R postgres "$run"
		chmod 600 "$run/userlist.txt"
		runuser -u postgres -- "$bin" -d "$run/pgbouncer.ini" >&2
	else
		"$bin" -d "$run/pgbouncer.ini" >&2
	fi
	for _ in $(seq 1 50); do port_open "$port" && break; sleep 0.1; done
	port_open "$port" || { tail -20 "$logfile" >&2 || true; die "PgBouncer did not listen on port $port within 5 s"; }
	echo "pgbouncer.sh: PgBouncer $("$bin" --version | head -1 | cut -d' ' -f2), $mode mode, on 127.0.0.1:$port in front of $host:$sport (run directory $run)" >&2
	echo "postgres://$user:$password@127.0.0.1:$port/$db?sslmode=disable"
}

stop() {
	running || { rm -f "$pidfile"; return 0; }
	local pid
	pid=$(cat "$pidfile")
	kill -INT "$pid"
	for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
	rm -f "$pidfile"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) if running; then echo "pgbouncer: up on port $port ($(grep -m1 pool_mode "$run/pgbouncer.ini"))"; else echo "pgbouncer: down"; exit 1; fi ;;
log) cat "$logfile" ;;
*) echo "usage: $0 start|stop|status|log" >&2; exit 2 ;;
esac

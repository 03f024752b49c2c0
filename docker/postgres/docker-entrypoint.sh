#!/bin/bash
# The official postgres image's start-up, for the variables tests and
# docker-compose.yml use: POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust),
# POSTGRES_USER (postgres), POSTGRES_DB ($POSTGRES_USER), POSTGRES_INITDB_ARGS,
# PGDATA, PGPORT (the port the server listens on; 5432) and the scripts in
# /docker-entrypoint-initdb.d (*.sh, *.sql).
set -Eeo pipefail

if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" != postgres ]; then
	exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$BASH_SOURCE" "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
export POSTGRES_USER POSTGRES_DB

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
		echo >&2 'Error: the database is uninitialized and the superuser password is not set: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)'
		exit 1
	fi
	pwfile=$(mktemp)
	printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	# shellcheck disable=SC2086
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" $POSTGRES_INITDB_ARGS
	rm -f "$pwfile"
	method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
	{
		echo
		echo "host all all all $method"
	} >>"$PGDATA/pg_hba.conf"
	grep -q "^listen_addresses" "$PGDATA/postgresql.conf" || echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"

	# The init server listens on the Unix socket only, as the official image's.
	export PGUSER="$POSTGRES_USER" PGPASSWORD="$POSTGRES_PASSWORD"
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p ${PGPORT:-5432}" -w start
	if [ "$POSTGRES_DB" != postgres ]; then
		psql -v ON_ERROR_STOP=1 --no-psqlrc --dbname postgres --set db="$POSTGRES_DB" <<-'SQL'
			CREATE DATABASE :"db";
		SQL
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh) echo "$0: running $f"; . "$f" ;;
		*.sql) echo "$0: running $f"; psql -v ON_ERROR_STOP=1 --no-psqlrc --dbname "$POSTGRES_DB" -f "$f" ;;
		*) ;;
		esac
	done
	pg_ctl -D "$PGDATA" -m fast -w stop
	unset PGUSER PGPASSWORD
	echo
	echo 'PostgreSQL init process complete; ready for start up.'
	echo
fi

exec "$@"

#!/usr/bin/env bash
# docker-compose.yml, driven for make up / make down / make compose-test.
#
#   scripts/compose.sh up     start Postgres, Kafka and the ledger worker; wait until all are healthy
#   scripts/compose.sh down   remove the containers, their volumes and network
#   scripts/compose.sh test   up on free ports, `load` then `verify` against it, down
#
# Uses Compose v2 (docker compose) when installed, else Compose v1
# (docker-compose; installed from Debian when neither is and we are root).
# When no registry answers (the golang image cannot be pulled), the images
# come from scripts/docker-images.sh, cached; else compose pulls and builds as
# usual. Ports: POSTGRES_PORT, KAFKA_PORT, KAFKA_CONTROLLER_PORT, METRICS_PORT
# (see docker-compose.yml); COMPOSE_PROJECT_NAME names the stack (exactly).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-exactly}
timeout=${COMPOSE_UP_TIMEOUT:-300}

say() { echo "compose: $*" >&2; }
die() { say "$*"; exit 1; }

compose=()
find_compose() {
	if docker compose version >/dev/null 2>&1; then
		compose=(docker compose)
	elif command -v docker-compose >/dev/null; then
		compose=(docker-compose)
	elif [ "$(id -u)" = 0 ]; then
		say "installing Debian's docker-compose"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >"${TMPDIR:-/tmp}/exactly-apt-compose.log" 2>&1 ||
			die "apt-get install docker-compose failed (${TMPDIR:-/tmp}/exactly-apt-compose.log)"
		compose=(docker-compose)
	else
		die "neither docker compose nor docker-compose is installed"
	fi
}

# healthy waits until every service of the stack reports healthy.
healthy() {
	local deadline=$((SECONDS + timeout)) id state bad
	while :; do
		bad=""
		for s in postgres kafka ledger-consumer; do
			id=$("${compose[@]}" ps -q "$s" 2>/dev/null || true)
			state=none
			[ -n "$id" ] && state=$(docker inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")
			case "$state" in
			running/healthy) ;;
			exited/* | dead/*) "${compose[@]}" logs --tail 40 "$s" >&2 || true; die "$s stopped ($state)" ;;
			*) bad+=" $s($state)" ;;
			esac
		done
		[ -z "$bad" ] && return 0
		if [ $SECONDS -ge $deadline ]; then
			"${compose[@]}" logs --tail 40 >&2 || true
			die "not healthy within ${timeout}s:$bad"
		fi
		sleep 1
	done
}

up() {
	scripts/docker-engine.sh start
	find_compose
	local t0=$SECONDS
	if docker image inspect golang:1.26 >/dev/null 2>&1 || docker pull -q golang:1.26 >/dev/null 2>&1; then
		"${compose[@]}" up -d --build
	else
		say "no registry answers: building the images locally (scripts/docker-images.sh)"
		scripts/docker-images.sh
		"${compose[@]}" up -d --no-build
	fi
	healthy
	say "up in $((SECONDS - t0))s: Postgres 127.0.0.1:${POSTGRES_PORT:-5432}, Kafka 127.0.0.1:${KAFKA_PORT:-9092}, worker /healthz 127.0.0.1:${METRICS_PORT:-9090}"
}

down() {
	find_compose
	"${compose[@]}" down -v --remove-orphans
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# test: the stack on free ports under its own project name, so it runs next
# to servers on the usual ports; load, then verify until the worker has
# applied everything (verify compares the balances with the whole topic).
test_stack() {
	export COMPOSE_PROJECT_NAME=exactly-compose-test-$$
	POSTGRES_PORT=$(free_port) KAFKA_PORT=$(free_port) KAFKA_CONTROLLER_PORT=$(free_port) METRICS_PORT=$(free_port)
	export POSTGRES_PORT KAFKA_PORT KAFKA_CONTROLLER_PORT METRICS_PORT
	trap 'down >/dev/null 2>&1 || true' EXIT
	local t0=$SECONDS
	up
	local db="postgres://postgres:postgres@127.0.0.1:$POSTGRES_PORT/exactly_test?sslmode=disable"
	local brokers=127.0.0.1:$KAFKA_PORT
	local bin=${TMPDIR:-/tmp}/exactly-ledger-consumer-$$
	go build -o "$bin" ./examples/ledger-consumer
	"$bin" load --brokers "$brokers" --n "${COMPOSE_TEST_COMMANDS:-2000}" --accounts 50
	local deadline=$((SECONDS + ${COMPOSE_VERIFY_TIMEOUT:-180})) out
	until out=$("$bin" verify --brokers "$brokers" --database-url "$db" --schema ledger 2>&1); do
		if [ $SECONDS -ge $deadline ]; then
			echo "$out" >&2
			"${compose[@]}" logs --tail 60 ledger-consumer >&2 || true
			rm -f "$bin"
			die "verify did not pass within ${COMPOSE_VERIFY_TIMEOUT:-180}s"
		fi
		sleep 2
	done
	echo "$out"
	rm -f "$bin"
	down
	trap - EXIT
	say "compose test passed in $((SECONDS - t0))s"
}

case "${1:-}" in
up) up ;;
down) down ;;
test) test_stack ;;
*) echo "usage: $0 up|down|test" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# `make test`: every test, with the race detector, against a real Postgres
# and a real Kafka broker, then a summary that counts the skipped tests and
# gives each one's reason.
#
# TEST_DATABASE_URL and TEST_KAFKA_BROKERS are used when set (as .ci/run sets
# them). Otherwise this starts the machine's PostgreSQL (scripts/postgres.sh)
# and a Kafka broker (scripts/kafka.sh, stopped again at the end if this
# started it). Whatever cannot be started is reported, and the tests that
# need it skip (fail with CI=true) and are listed in the summary.
#
# Environment: GO (go), PKGS (every package of every module of the workspace,
# go.work; ./... alone stops at the nested modules), TESTFLAGS (extra go test
# flags).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
PKGS=${PKGS:-$(scripts/packages.sh)}
bin=$(mktemp -d)
stop_kafka=
cleanup() {
	rm -rf "$bin"
	if [ -n "$stop_kafka" ]; then scripts/kafka.sh stop || true; fi
}
trap cleanup EXIT

if [ -z "${TEST_DATABASE_URL:-}" ]; then
	if url=$(scripts/postgres.sh start); then
		export TEST_DATABASE_URL=$url
		echo "test.sh: Postgres at ${url%%\?*}" | sed 's#//\([^:]*\):[^@]*@#//\1:***@#' >&2
	else
		echo "test.sh: no Postgres (above); the tests that need it skip, listed at the end" >&2
	fi
fi
if [ -z "${TEST_KAFKA_BROKERS:-}" ]; then
	running=
	scripts/kafka.sh status >/dev/null 2>&1 && running=yes
	if brokers=$(scripts/kafka.sh start); then
		export TEST_KAFKA_BROKERS=$brokers
		[ -n "$running" ] || stop_kafka=yes
		echo "test.sh: Kafka at $brokers" >&2
	else
		echo "test.sh: no Kafka broker (above); the tests use an in-process one, and those that need a real one skip" >&2
	fi
fi

"$GO" build -o "$bin/testsum" ./scripts/testsum
# Watermill's TestReconnect (restarts of a broker of its own under 100
# publishers) races on a slice of its own, so it runs in a second go test
# without the race detector; one summary counts both.
reconnect='^TestPubSub$/^TestReconnect$'
reconnect_pkg=
# shellcheck disable=SC2086
if "$GO" list $PKGS 2>/dev/null | grep -qx 'github.com/exactly-go/exactly/kafkapubsub'; then reconnect_pkg=./kafkapubsub; fi
{
	# shellcheck disable=SC2086 # PKGS and TESTFLAGS are lists
	"$GO" test -json -race -count=1 -timeout 20m -skip "$reconnect" ${TESTFLAGS:-} $PKGS
	if [ -n "$reconnect_pkg" ]; then
		# shellcheck disable=SC2086
		"$GO" test -json -count=1 -timeout 10m -run "$reconnect" ${TESTFLAGS:-} "$reconnect_pkg"
	fi
} 2>&1 | "$bin/testsum"

#!/usr/bin/env bash
# make test-docker: the suite with every service from testcontainers-go, as on
# a laptop with Docker. Starts the Docker engine when nothing answers
# (scripts/docker-engine.sh), builds the images without a registry
# (scripts/docker-images.sh), unsets TEST_DATABASE_URL, TEST_KAFKA_BROKERS,
# DATABASE_URL and KAFKA_BROKERS, and sets EXACTLY_REQUIRE_SOURCE=testcontainers:
# a test whose Postgres or Kafka came from anywhere else fails.
#
# Ryuk, testcontainers' reaper, is disabled (TESTCONTAINERS_RYUK_DISABLED=true):
# its image would come from a registry. The containers carry the label
# dev.exactly.testenv=<this run> and are removed here when the run ends.
#
# The containers come from internal/testkit/testservices (a module of its own, so
# that testcontainers-go stays out of the library's go.mod), run by the test
# kit as a helper process; it is built once here for the whole run
# (EXACTLY_TESTSERVICES).
#
#   scripts/test-docker.sh [packages...]     (default: every module of go.work;
#                                             DOCKER_TEST_FLAGS adds go test flags)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/docker-engine.sh start
scripts/docker-images.sh postgres kafka

run=test-docker-$$-$(date +%s)
bin=$(mktemp -d)
cleanup() {
	rm -rf "$bin"
	local ids
	ids=$(docker ps -aq --filter "label=dev.exactly.testenv=$run")
	if [ -n "$ids" ]; then
		echo "test-docker: removing $(echo "$ids" | wc -l) containers" >&2
		# shellcheck disable=SC2086
		docker rm -f -v $ids >/dev/null
	fi
}
trap cleanup EXIT

unset TEST_DATABASE_URL TEST_KAFKA_BROKERS DATABASE_URL KAFKA_BROKERS
export EXACTLY_REQUIRE_SOURCE=testcontainers EXACTLY_TESTENV_RUN=$run
export TESTCONTAINERS_RYUK_DISABLED=true CI=${CI:-true}
# The fault tests start brokers of their own (scripts/kafka.sh); next to the
# containers, on a loaded machine, they need longer than its default 60 s.
export KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-180}
# The chaos suite runs its own Postgres cluster and broker, never services
# from the kit: make test has run it already.
export CHAOS=${CHAOS:-0}
go build -o "$bin/testservices" ./internal/testkit/testservices
export EXACTLY_TESTSERVICES=$bin/testservices
# shellcheck disable=SC2046 # one pattern per module
[ $# -gt 0 ] || set -- $(scripts/packages.sh)
# shellcheck disable=SC2086
go test -race -count=1 -timeout 20m ${DOCKER_TEST_FLAGS:-} "$@"

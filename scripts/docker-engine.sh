#!/usr/bin/env bash
# Makes sure a Docker engine answers, for make test-docker and make up.
#
#   scripts/docker-engine.sh start   install Debian's docker.io when there is no
#                                    dockerd (needs root), start dockerd when
#                                    nothing answers, wait until it does
#   scripts/docker-engine.sh stop    stop a dockerd that start started
#
# A dockerd started here has no bridge network (--bridge=none, no iptables):
# the tests and docker-compose.yml use host networking and loopback only, and
# image builds run with --network host. Its log and pid file are in
# ${DOCKERD_RUN_DIR:-/run/exactly-dockerd}. An engine that already answers is
# used as it is.
set -euo pipefail

run=${DOCKERD_RUN_DIR:-/run/exactly-dockerd}
timeout=${DOCKERD_START_TIMEOUT:-60}

say() { echo "docker-engine: $*" >&2; }
die() { say "$*"; exit 1; }

answers() { docker info >/dev/null 2>&1; }

start() {
	if answers; then
		return 0
	fi
	if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
		[ "$(id -u)" = 0 ] || die "no Docker engine and not root: install Docker (apt-get install -y docker.io) and start it"
		say "installing Debian's docker.io"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -q docker.io >"${TMPDIR:-/tmp}/exactly-apt-docker.log" 2>&1 || {
			apt-get update -q >/dev/null 2>&1 || true
			apt-get install -y -q docker.io >"${TMPDIR:-/tmp}/exactly-apt-docker.log" 2>&1 ||
				{ tail -20 "${TMPDIR:-/tmp}/exactly-apt-docker.log" >&2; die "apt-get install docker.io failed"; }
		}
	fi
	if [ -S /var/run/docker.sock ] && pgrep -x dockerd >/dev/null; then
		say "a dockerd runs but does not answer yet; waiting"
	else
		[ "$(id -u)" = 0 ] || die "dockerd is not running and only root can start it"
		mkdir -p "$run"
		# A pid file left by a dockerd that is gone (a machine stopped
		# without "stop") names a pid another process may have now, and
		# dockerd refuses to start while that one runs.
		if [ -f "$run/dockerd.pid" ] && [ "$(ps -p "$(cat "$run/dockerd.pid")" -o comm= 2>/dev/null)" != dockerd ]; then
			rm -f "$run/dockerd.pid"
		fi
		say "starting dockerd (log: $run/dockerd.log)"
		nohup dockerd --bridge=none --iptables=false --ip6tables=false --pidfile "$run/dockerd.pid" \
			>"$run/dockerd.log" 2>&1 </dev/null &
	fi
	local deadline=$((SECONDS + timeout))
	until answers; do
		if [ $SECONDS -ge $deadline ]; then
			tail -20 "$run/dockerd.log" >&2 || true
			die "the Docker engine did not answer within ${timeout}s"
		fi
		sleep 0.5
	done
	say "Docker engine $(docker version -f '{{.Server.Version}}') answers"
}

stop() {
	[ -f "$run/dockerd.pid" ] || { say "no dockerd started by this script"; return 0; }
	local pid
	pid=$(cat "$run/dockerd.pid")
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	rm -f "$run/dockerd.pid"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Runs a real Apache Kafka broker (single-node KRaft: broker + controller in
# one JVM) on 127.0.0.1 for tests, CI and the demo, without Docker.
#
#   scripts/kafka.sh start    fetch (once), format a fresh run directory and start;
#                             wait until it serves
#   scripts/kafka.sh stop     stop it cleanly and remove its data
#   scripts/kafka.sh restart  start again on the data of the run directory (after
#                             a crash or kill): topics, records, committed offsets
#                             and transactions survive; stops a running broker first
#   scripts/kafka.sh kill     kill -9 the broker and keep its data (fault tests)
#   scripts/kafka.sh pid      the running broker's pid (to pause it with SIGSTOP)
#   scripts/kafka.sh status
#   scripts/kafka.sh log      the broker's log
#
# The broker and its dependencies come from Maven Central through
# scripts/kafka/pom.xml (kafka.version there, or KAFKA_VERSION) and are cached in
# ${XDG_CACHE_HOME:-~/.cache}/exactly/kafka-<version>, so later starts are
# instant. Nothing downloaded is committed. Needs Java 17+ and Maven.
#
# Environment: KAFKA_VERSION (the pom's; 3.9 and 4.x run), KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (9093),
# KAFKA_RUN_DIR (${TMPDIR:-/tmp}/exactly-kafka-$KAFKA_PORT: config, data, log
# and pid file), KAFKA_HEAP (512m), KAFKA_START_TIMEOUT seconds (60),
# KAFKA_PROPERTIES (server.properties lines added by start; later lines win).
# A fault test runs a broker of its own by setting the two ports and the run
# directory, so it never touches the shared broker.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
pom="$here/kafka/pom.xml"
version=${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")}
port=${KAFKA_PORT:-9092}
cport=${KAFKA_CONTROLLER_PORT:-9093}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/exactly/kafka-$version
run=${KAFKA_RUN_DIR:-${TMPDIR:-/tmp}/exactly-kafka-$port}
pidfile=$run/broker.pid
logfile=$run/broker.log
timeout=${KAFKA_START_TIMEOUT:-60}

die() { echo "kafka.sh: $*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# running: the pid file names a live broker of this run directory (a stale
# pid file whose pid now belongs to another process does not count).
running() {
	[ -f "$pidfile" ] || return 1
	local pid
	pid=$(cat "$pidfile")
	kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $run/server.properties"
}

fetch() {
	[ -f "$cache/.complete" ] && return 0
	command -v java >/dev/null || die "Java is not installed: Kafka $version needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
	command -v mvn >/dev/null || die "Maven is not installed: it fetches Kafka $version from Maven Central (apt-get install maven)"
	echo "kafka.sh: fetching Kafka $version from Maven Central into $cache" >&2
	rm -rf "$cache.tmp"
	mvn -q -B -Dstyle.color=never -f "$pom" -Dkafka.version="$version" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$cache.tmp/libs" >&2 ||
		die "could not fetch Kafka $version with Maven (see the output above)"
	rm -rf "$cache"
	mv "$cache.tmp" "$cache"
	touch "$cache/.complete"
}

javacheck() {
	local v
	v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
	[ -n "$v" ] && [ "$v" -ge 17 ] || die "Kafka $version needs Java 17 or newer; found: $(java -version 2>&1 | head -1)"
}

start() {
	if running; then
		echo "kafka.sh: Kafka $version already running on 127.0.0.1:$port (pid $(cat "$pidfile"))" >&2
		echo "127.0.0.1:$port"
		return 0
	fi
	for p in "$port" "$cport"; do
		port_open "$p" && die "port $p is taken by another process (ss -ltnp 'sport = :$p'); stop it or set KAFKA_PORT / KAFKA_CONTROLLER_PORT"
	done
	command -v java >/dev/null || die "Java is not installed: Kafka $version needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
	javacheck
	fetch
	rm -rf "$run"
	mkdir -p "$run/data"
	sed -e "s#@DATA@#$run/data#" -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$cport#g" \
		"$here/kafka/server.properties" >"$run/server.properties"
	[ -z "${KAFKA_PROPERTIES:-}" ] || printf '%s\n' "$KAFKA_PROPERTIES" >>"$run/server.properties"
	local cp="$cache/libs/*"
	local id
	id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
	[ -n "$id" ] || die "could not run Kafka's storage tool (java -cp '$cp' kafka.tools.StorageTool)"
	java -cp "$cp" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
		kafka.tools.StorageTool format -t "$id" -c "$run/server.properties" >"$run/format.log" 2>&1 ||
		{ cat "$run/format.log" >&2; die "formatting the storage failed"; }
	launch
}

# launch starts the JVM on the run directory as it is and waits until the
# broker serves.
launch() {
	local cp="$cache/libs/*"
	# A restarted broker appends to its log: "Kafka Server started" must come
	# from this start, so wait for one more occurrence than there was.
	local before=0
	[ -f "$logfile" ] && before=$(grep -c "Kafka Server started" "$logfile" || true)
	touch "$logfile"
	nohup java -Xms${KAFKA_HEAP:-512m} -Xmx${KAFKA_HEAP:-512m} -XX:+UseG1GC -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
		-cp "$cp" kafka.Kafka "$run/server.properties" >>"$logfile" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$pidfile"
	local deadline=$((SECONDS + timeout))
	until [ "$(grep -c "Kafka Server started" "$logfile" || true)" -gt "$before" ] && port_open "$port"; do
		# kill -0, not running: right after the fork the child may not have
		# become java yet.
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -40 "$logfile" >&2
			die "the broker exited during start-up (log above, full log in $logfile)"
		fi
		if [ $SECONDS -ge $deadline ]; then
			tail -40 "$logfile" >&2
			halt
			die "the broker did not start within ${timeout}s (log above)"
		fi
		sleep 0.5
	done
	echo "kafka.sh: Kafka $version up on 127.0.0.1:$port (pid $(cat "$pidfile"), log $logfile)" >&2
	echo "127.0.0.1:$port"
}

# restart starts the broker again on the data it left in the run directory.
restart() {
	[ -f "$run/server.properties" ] && [ -f "$run/data/meta.properties" ] ||
		die "no broker data in $run to restart on: use start for a fresh broker"
	running && halt
	for p in "$port" "$cport"; do
		port_open "$p" && die "port $p is taken by another process (ss -ltnp 'sport = :$p'); stop it or set KAFKA_PORT / KAFKA_CONTROLLER_PORT"
	done
	javacheck
	fetch
	launch
}

# halt stops the broker (SIGTERM, then SIGKILL after 30 s) and keeps its data.
halt() {
	running || return 0
	local pid
	pid=$(cat "$pidfile")
	kill -CONT "$pid" 2>/dev/null || true # a paused broker cannot act on SIGTERM
	kill -TERM "$pid"
	for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	if kill -0 "$pid" 2>/dev/null; then
		echo "kafka.sh: broker did not stop in 30s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

# crash kills the broker with SIGKILL, as a power cut would, and keeps its data.
crash() {
	running || die "not running"
	local pid
	pid=$(cat "$pidfile")
	kill -KILL "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	echo "kafka.sh: killed pid $pid; data kept in $run (restart resumes on it)" >&2
}

stop() {
	if ! running; then
		echo "kafka.sh: not running" >&2
		rm -rf "$run"
		return 0
	fi
	halt
	rm -rf "$run"
	echo "kafka.sh: stopped" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) restart ;;
kill) crash ;;
pid) if running; then cat "$pidfile"; else echo "kafka.sh: not running" >&2; exit 1; fi ;;
status) if running; then echo "kafka: Kafka $version up on 127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "kafka: down"; exit 1; fi ;;
log) cat "$logfile" ;;
fetch) fetch ;;
*) echo "usage: $0 start|stop|restart|kill|pid|status|log|fetch" >&2; exit 2 ;;
esac

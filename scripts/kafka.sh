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
#   scripts/kafka.sh cluster start|stop|status|kill N|restart N|pid N|log N
#                             a three-node cluster instead (see "Cluster" below)
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
		-cp "$cp" kafka.Kafka "$run/server.properties" >>"$logfile" 2>&1 </dev/null 9>&- &
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

# Cluster: KAFKA_CLUSTER_SIZE (3) KRaft nodes on loopback, each broker and
# controller in one JVM, the controllers a quorum of every node (3 voters:
# one node may be down and the cluster still elects leaders and takes
# writes). Topics default to replication factor 3 and min.insync.replicas=2,
# the internal topics too, so an acks=all write is on two nodes before it is
# acknowledged. One JVM per node rather than separate controller processes:
# three JVMs instead of six on a small machine, and killing the active
# controller then also kills a broker that leads partitions, the harder case.
#
#   cluster start      format fresh run directories and start every node; wait
#                      until all serve; prints the bootstrap list a,b,c
#   cluster stop       stop every node and remove the data
#   cluster status     one line per node
#   cluster kill N     kill -9 node N (1-based) and keep its data
#   cluster restart N  start node N again on its data (stops it first if running)
#   cluster pid N      node N's pid (to pause it with SIGSTOP)
#   cluster log N      node N's log
#   cluster controller the node that is the active controller (the quorum's
#                      leader, by the newest epoch the running nodes recorded)
#
# Environment: KAFKA_CLUSTER_PORTS and KAFKA_CLUSTER_CONTROLLER_PORTS
# (comma-separated, one per node; default consecutive ports from KAFKA_PORT
# and KAFKA_CONTROLLER_PORT when set, else from 19092 and 19192),
# KAFKA_CLUSTER_ADVERTISED_PORTS (the ports clients are told to use, one per
# node, for a proxy in front of each node; default the ports themselves),
# KAFKA_CLUSTER_PROXIED_PORTS (one per node: a second listener, PROXIED, on
# each, which advertises KAFKA_CLUSTER_ADVERTISED_PORTS while the first
# advertises its own port; the nodes replicate on the first, so a proxy
# from each advertised port to the node's PROXIED port sits between the
# clients that bootstrap through it and the cluster, never between the
# nodes; clients bootstrapping on the first ports go direct),
# KAFKA_RUN_DIR (${TMPDIR:-/tmp}/exactly-kafka-cluster-<first port>: one
# node-N directory per node), KAFKA_HEAP, KAFKA_START_TIMEOUT and
# KAFKA_PROPERTIES as for the single broker (applied to every node).
cluster_size=${KAFKA_CLUSTER_SIZE:-3}
cluster_ports=() cluster_cports=() cluster_aports=() cluster_qports=()

cluster_list() { # name default-base: the comma list in $name, or consecutive ports from base
	local list=${!1:-} base=$2 i
	if [ -n "$list" ]; then
		tr ',' ' ' <<<"$list"
	else
		for ((i = 0; i < cluster_size; i++)); do printf '%s ' $((base + i)); done
	fi
}

cluster_init() {
	[[ "$cluster_size" =~ ^[1-9]$ ]] || die "KAFKA_CLUSTER_SIZE=$cluster_size: use 1 to 9 nodes"
	read -ra cluster_ports <<<"$(cluster_list KAFKA_CLUSTER_PORTS "${KAFKA_PORT:-19092}")"
	read -ra cluster_cports <<<"$(cluster_list KAFKA_CLUSTER_CONTROLLER_PORTS "${KAFKA_CONTROLLER_PORT:-19192}")"
	if [ -n "${KAFKA_CLUSTER_ADVERTISED_PORTS:-}" ]; then
		read -ra cluster_aports <<<"$(tr ',' ' ' <<<"$KAFKA_CLUSTER_ADVERTISED_PORTS")"
	else
		cluster_aports=("${cluster_ports[@]}")
	fi
	[ ${#cluster_ports[@]} -eq "$cluster_size" ] && [ ${#cluster_cports[@]} -eq "$cluster_size" ] && [ ${#cluster_aports[@]} -eq "$cluster_size" ] ||
		die "KAFKA_CLUSTER_PORTS, KAFKA_CLUSTER_CONTROLLER_PORTS and KAFKA_CLUSTER_ADVERTISED_PORTS need $cluster_size ports each (KAFKA_CLUSTER_SIZE)"
	if [ -n "${KAFKA_CLUSTER_PROXIED_PORTS:-}" ]; then
		read -ra cluster_qports <<<"$(tr ',' ' ' <<<"$KAFKA_CLUSTER_PROXIED_PORTS")"
		[ ${#cluster_qports[@]} -eq "$cluster_size" ] || die "KAFKA_CLUSTER_PROXIED_PORTS needs $cluster_size ports (KAFKA_CLUSTER_SIZE)"
		[ -n "${KAFKA_CLUSTER_ADVERTISED_PORTS:-}" ] || die "KAFKA_CLUSTER_PROXIED_PORTS needs KAFKA_CLUSTER_ADVERTISED_PORTS: the ports the proxies listen on"
	fi
	cluster_run=${KAFKA_RUN_DIR:-${TMPDIR:-/tmp}/exactly-kafka-cluster-${cluster_ports[0]}}
}

# cluster_node N points the single-broker functions (running, halt, crash)
# at node N.
cluster_node() {
	[[ "${1:-}" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$cluster_size" ] || die "cluster: name a node from 1 to $cluster_size"
	node=$1
	port=${cluster_ports[$((node - 1))]}
	cport=${cluster_cports[$((node - 1))]}
	qport=${cluster_qports[$((node - 1))]:-}
	run=$cluster_run/node-$node
	pidfile=$run/broker.pid
	logfile=$run/broker.log
}

cluster_props() {
	local voters="" i
	for ((i = 1; i <= cluster_size; i++)); do voters+="${voters:+,}$i@127.0.0.1:${cluster_cports[$((i - 1))]}"; done
	local isr=$((cluster_size > 1 ? 2 : 1))
	sed -e "s#@DATA@#$run/data#" -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$cport#g" "$here/kafka/server.properties"
	cat <<-EOF
		# cluster node $node of $cluster_size
		node.id=$node
		controller.quorum.voters=$voters
		default.replication.factor=$cluster_size
		min.insync.replicas=$isr
		offsets.topic.replication.factor=$cluster_size
		transaction.state.log.replication.factor=$cluster_size
		transaction.state.log.min.isr=$isr
		share.coordinator.state.topic.replication.factor=$cluster_size
		share.coordinator.state.topic.min.isr=$isr
		# Elections that a loaded machine can finish: at Kafka's 1 s the three
		# nodes can go on splitting the vote while they are busy starting.
		controller.quorum.election.timeout.ms=2500
		controller.quorum.election.backoff.max.ms=2500
		controller.quorum.fetch.timeout.ms=5000
		controller.quorum.request.timeout.ms=5000
	EOF
	if [ -n "$qport" ]; then
		cat <<-EOF
			# clients through a proxy on ${cluster_aports[$((node - 1))]} reach PROXIED; the nodes replicate on PLAINTEXT
			listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,PROXIED://127.0.0.1:$qport
			advertised.listeners=PLAINTEXT://127.0.0.1:$port,PROXIED://127.0.0.1:${cluster_aports[$((node - 1))]}
			listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT
		EOF
	else
		echo "advertised.listeners=PLAINTEXT://127.0.0.1:${cluster_aports[$((node - 1))]}"
	fi
	[ -z "${KAFKA_PROPERTIES:-}" ] || printf '%s\n' "$KAFKA_PROPERTIES"
}

# cluster_fork starts node $node's JVM on its run directory and returns
# at once: a node of a quorum cannot finish starting until enough others run.
cluster_fork() {
	local cp="$cache/libs/*"
	touch "$logfile"
	cluster_before=$(grep -c "Kafka Server started" "$logfile" || true)
	echo "$cluster_before" >"$run/starts"
	nohup java -Xms${KAFKA_HEAP:-512m} -Xmx${KAFKA_HEAP:-512m} -XX:+UseG1GC -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
		-cp "$cp" kafka.Kafka "$run/server.properties" >>"$logfile" 2>&1 </dev/null &
	echo $! >"$pidfile"
}

# cluster_wait waits until node $node, forked by cluster_fork, serves.
cluster_wait() {
	local pid before deadline=$((SECONDS + timeout))
	pid=$(cat "$pidfile")
	before=$(cat "$run/starts")
	until [ "$(grep -c "Kafka Server started" "$logfile" || true)" -gt "$before" ] && port_open "$port"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -40 "$logfile" >&2
			die "node $node exited during start-up (log above, full log in $logfile)"
		fi
		if [ $SECONDS -ge $deadline ]; then
			tail -40 "$logfile" >&2
			die "node $node did not start within ${timeout}s (log above; scripts/kafka.sh cluster stop cleans up)"
		fi
		sleep 0.5
	done
	echo "kafka.sh: cluster node $node up on 127.0.0.1:$port (pid $pid, log $logfile)" >&2
}

cluster_free() {
	local p
	for p in "$port" "$cport" $qport; do
		port_open "$p" && die "port $p (node $node) is taken by another process (ss -ltnp 'sport = :$p'); stop it or set KAFKA_CLUSTER_PORTS / KAFKA_CLUSTER_CONTROLLER_PORTS / KAFKA_CLUSTER_PROXIED_PORTS"
	done
	return 0
}

cluster_bootstrap() {
	local i out=""
	local ps=("${cluster_aports[@]}")
	[ ${#cluster_qports[@]} -eq 0 ] || ps=("${cluster_ports[@]}") # the direct ports: the proxies are the caller's
	for ((i = 0; i < cluster_size; i++)); do out+="${out:+,}127.0.0.1:${ps[$i]}"; done
	echo "$out"
}

cluster_start() {
	local i up=0
	for ((i = 1; i <= cluster_size; i++)); do cluster_node $i; running && up=$((up + 1)); done
	if [ $up -eq "$cluster_size" ]; then
		echo "kafka.sh: the cluster is already running in $cluster_run" >&2
		cluster_bootstrap
		return 0
	fi
	[ $up -eq 0 ] || die "the cluster in $cluster_run runs $up of $cluster_size nodes: cluster restart N, or cluster stop first"
	for ((i = 1; i <= cluster_size; i++)); do cluster_node $i; cluster_free; done
	command -v java >/dev/null || die "Java is not installed: Kafka $version needs Java 17 or newer (apt-get install openjdk-17-jre-headless)"
	javacheck
	fetch
	local cp="$cache/libs/*" id
	id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
	[ -n "$id" ] || die "could not run Kafka's storage tool (java -cp '$cp' kafka.tools.StorageTool)"
	rm -rf "$cluster_run"
	for ((i = 1; i <= cluster_size; i++)); do
		cluster_node $i
		mkdir -p "$run/data"
		cluster_props >"$run/server.properties"
		java -cp "$cp" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
			kafka.tools.StorageTool format -t "$id" -c "$run/server.properties" >"$run/format.log" 2>&1 ||
			{ cat "$run/format.log" >&2; die "formatting the storage of node $i failed"; }
	done
	for ((i = 1; i <= cluster_size; i++)); do cluster_node $i; cluster_fork; done
	for ((i = 1; i <= cluster_size; i++)); do cluster_node $i; cluster_wait; done
	cluster_bootstrap
}

cluster_restart() {
	cluster_node "$1"
	[ -f "$run/server.properties" ] && [ -f "$run/data/meta.properties" ] ||
		die "no data of node $node in $run to restart on: use cluster start for a fresh cluster"
	running && halt
	cluster_free
	javacheck
	fetch
	cluster_fork
	cluster_wait
}

cluster_stop() {
	local i
	for ((i = 1; i <= cluster_size; i++)); do
		cluster_node $i
		running && halt &
	done
	wait
	rm -rf "$cluster_run"
	echo "kafka.sh: cluster stopped" >&2
}

# cluster_controller prints the active controller's node id: the leaderId
# of the highest leaderEpoch in the quorum-state files of the running nodes.
cluster_controller() {
	local i best=-1 leader="" st e l
	for ((i = 1; i <= cluster_size; i++)); do
		cluster_node $i
		running || continue
		st=$(cat "$run/data/__cluster_metadata-0/quorum-state" 2>/dev/null) || continue
		e=$(sed -n 's/.*"leaderEpoch":\([0-9-]*\).*/\1/p' <<<"$st")
		l=$(sed -n 's/.*"leaderId":\([0-9-]*\).*/\1/p' <<<"$st")
		if [ -n "$e" ] && [ -n "$l" ] && [ "$l" -ge 1 ] && [ "$e" -gt "$best" ]; then best=$e leader=$l; fi
	done
	[ -n "$leader" ] || die "no running node knows the quorum's leader yet"
	echo "$leader"
}

cluster() {
	cluster_init
	local verb=${1:-}
	shift || true
	case "$verb" in
	start) cluster_start ;;
	stop) cluster_stop ;;
	restart) cluster_restart "${1:-}" ;;
	kill) cluster_node "${1:-}"; crash ;;
	pid) cluster_node "${1:-}"; if running; then cat "$pidfile"; else echo "kafka.sh: node $node not running" >&2; exit 1; fi ;;
	log) cluster_node "${1:-}"; cat "$logfile" ;;
	controller) cluster_controller ;;
	status)
		local i down=0
		for ((i = 1; i <= cluster_size; i++)); do
			cluster_node $i
			if running; then echo "kafka: node $i up on 127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "kafka: node $i down"; down=1; fi
		done
		return $down
		;;
	*) echo "usage: $0 cluster start|stop|status|kill N|restart N|pid N|log N|controller" >&2; exit 2 ;;
	esac
}

# One command at a time on a broker's run directory (Watermill's
# TestReconnect, for one, may ask for a restart while another runs). The
# lock is the file beside the run directory; the broker does not inherit it.
serialize() {
	mkdir -p "$(dirname "$run")"
	exec 9>"$run.lock"
	flock 9
}
case "${1:-}" in start | stop | restart | kill) serialize ;; esac

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) restart ;;
kill) crash ;;
pid) if running; then cat "$pidfile"; else echo "kafka.sh: not running" >&2; exit 1; fi ;;
status) if running; then echo "kafka: Kafka $version up on 127.0.0.1:$port (pid $(cat "$pidfile"))"; else echo "kafka: down"; exit 1; fi ;;
log) cat "$logfile" ;;
fetch) fetch ;;
cluster) shift; cluster "$@" ;;
*) echo "usage: $0 start|stop|restart|kill|pid|status|log|fetch|cluster" >&2; exit 2 ;;
esac

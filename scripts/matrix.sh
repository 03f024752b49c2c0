#!/usr/bin/env bash
# `make test-matrix`: the packages that talk to the servers, run against each
# supported PostgreSQL and each supported Kafka, one axis at a time (the other
# at its default), every server of the matrix's own, on ports of its own:
#
#   PostgreSQL axis: each release of MATRIX_PG (binaries from Maven Central,
#                    tools/pgserver) with Kafka at the pom's
#                    version (scripts/kafka/pom.xml)
#   Kafka axis:      each release of MATRIX_KAFKA (scripts/kafka.sh with
#                    KAFKA_VERSION) with the machine's PostgreSQL
#
# Before a cell's tests run, the script asks each of the cell's servers what
# it is (SHOW server_version; the broker's own "Kafka version" line) and
# refuses a mismatch; after them, it checks that the cell's Postgres did the
# work (its commit count grew). The test binaries are built once (with the
# race detector) and run in every cell. Tests that start a Kafka broker of
# their own (kafkatest.StartOwn) inherit KAFKA_VERSION, so they run the
# cell's Kafka too. Downloads are cached under ~/.cache/exactly.
#
# Environment:
#   MATRIX_PKGS     the packages (default below), each a directory, with
#                   @pg or @kafka when it talks to one server only: it runs
#                   on that axis only (pgstore never reaches Kafka, so
#                   running it against each Kafka tests nothing); @edges:
#                   on the Kafka axis and on the first and last releases
#                   of MATRIX_PG only (a package whose SQL is pgstore's,
#                   which every PostgreSQL cell runs)
#   MATRIX_PG       PostgreSQL releases (io.zonky.test.postgres versions;
#                   set and empty: no PostgreSQL cell)
#   MATRIX_KAFKA    Kafka releases (org.apache.kafka:kafka_2.13 versions;
#                   set and empty: no Kafka cell)
#   MATRIX_SKIP     go test -skip pattern: tests that start a PostgreSQL of
#                   their own from the machine's binaries, which would not
#                   be the cell's version
#   MATRIX_JOBS     cells run at once (2)
#   MATRIX_PG_PORT  first PostgreSQL port (25432; one per cell, in order)
#   MATRIX_KAFKA_PORT first Kafka port (26092; one per version, controller
#                   port +100)
#   MATRIX_DIR      run directories and logs (${TMPDIR:-/tmp}/exactly-matrix)
#   TESTFLAGS       extra flags for the test binaries (-test.run=…)
# It exits 1 if a cell failed, and prints which packages ran on which
# versions, with their counts and times.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
GO=${GO:-go}
# The packages that talk to Postgres or Kafka, as directories; @pg or
# @kafka limits one to an axis, @edges to the Kafka axis and the first and
# last PostgreSQL releases.
MATRIX_PKGS=${MATRIX_PKGS:-./pgstore@pg ./migrations@pg ./outbox ./consumer@edges ./kafkapubsub@kafka ./kgopubsub@kafka ./examples/ledger-consumer/ledger ./cmd/replay/internal/ledgertest@kafka}
MATRIX_PG=${MATRIX_PG-13.23.0 14.24.0 15.19.0 16.15.0 17.11.0 18.6.0}
MATRIX_KAFKA=${MATRIX_KAFKA-3.9.2 4.4.0}
MATRIX_SKIP=${MATRIX_SKIP:-^TestOpenDBStartsThrowawayServer$}
MATRIX_JOBS=${MATRIX_JOBS:-2}
# Below the kernel's ephemeral range (32768 on): a port there may be taken
# by any client connection of the moment.
pgport=${MATRIX_PG_PORT:-25432}
kport=${MATRIX_KAFKA_PORT:-26092}
dir=${MATRIX_DIR:-${TMPDIR:-/tmp}/exactly-matrix}
default_kafka=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)

die() { echo "matrix.sh: $*" >&2; exit 1; }
command -v psql >/dev/null || die "psql is not installed (apt-get install postgresql-client)"

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/tests" "$dir/logs"
started=$SECONDS

brokers=() # "version port"
cleanup() {
	local b
	for b in "${brokers[@]}"; do
		set -- $b
		KAFKA_VERSION=$1 KAFKA_PORT=$2 KAFKA_CONTROLLER_PORT=$(($2 + 100)) KAFKA_RUN_DIR="$dir/kafka-$1" \
			scripts/kafka.sh stop >/dev/null 2>&1 || true
	done
	local p
	for p in "$dir"/logs/*/pg/pid; do
		[ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "matrix: building the test binaries (race detector) and pgserver"
"$GO" build -o "$dir/bin/pgserver" ./tools/pgserver
"$GO" build -o "$dir/bin/testsum" ./scripts/testsum
pkgs=() # "dir axis", axis pg, kafka, both or edges
for entry in $MATRIX_PKGS; do
	p=${entry%@*}
	axis=both
	[ "$p" = "$entry" ] || axis=${entry##*@}
	case $axis in pg | kafka | both | edges) ;; *) die "MATRIX_PKGS: $entry: the axis after @ is pg, kafka or edges" ;; esac
	name=$(echo "${p#./}" | tr / _)
	"$GO" test -c -race -o "$dir/tests/$name.test" "$p"
	[ -x "$dir/tests/$name.test" ] || die "$p has no tests"
	pkgs+=("$p $axis")
done

# kafka_start VERSION PORT: a broker of the matrix's, its version checked.
kafka_start() {
	local v=$1 port=$2 run="$dir/kafka-$1"
	brokers+=("$v $port")
	KAFKA_VERSION=$v KAFKA_PORT=$port KAFKA_CONTROLLER_PORT=$((port + 100)) KAFKA_RUN_DIR="$run" \
		KAFKA_START_TIMEOUT=180 scripts/kafka.sh start >/dev/null
	local said
	said=$(sed -n 's/.*Kafka version: \([^ ]*\) .*/\1/p' "$run/broker.log" | head -1)
	[ "$said" = "$v" ] || die "the broker on port $port says it is Kafka '$said', not $v"
	echo "matrix: Kafka $v up on 127.0.0.1:$port (the broker says: Kafka version: $said)"
}

# pg_start RELEASE|machine PORT RUNDIR: a server of the matrix's; prints its
# URL once it answers and says it is the release asked for.
pg_start() {
	local rel=$1 port=$2 run=$3
	mkdir -p "$run/tmp"
	chmod 755 "$run" "$run/tmp"
	local args=(-port "$port")
	if [ "$rel" = machine ]; then args+=(-machine); else args+=(-version "$rel"); fi
	TMPDIR="$run/tmp" "$dir/bin/pgserver" "${args[@]}" >"$run/url" 2>"$run/log" &
	echo $! >"$run/pid"
	local i
	for i in $(seq 1 600); do
		[ -s "$run/url" ] && break
		kill -0 "$(cat "$run/pid")" 2>/dev/null || { cat "$run/log" >&2; die "PostgreSQL $rel did not start (above)"; }
		sleep 0.5
	done
	[ -s "$run/url" ] || die "PostgreSQL $rel did not start within 5 minutes"
	local url want said
	url=$(cat "$run/url")
	if [ "$rel" = machine ]; then
		want=$("$(pg_config --bindir)/postgres" --version | sed -n 's/.* \([0-9][0-9.]*\).*/\1/p')
	else
		want=${rel%.*} # 13.23.0 is PostgreSQL 13.23
	fi
	said=$(psql "$url" -XtAc 'SHOW server_version' | awk '{print $1}')
	[ "$said" = "$want" ] || die "the server on port $port says it is PostgreSQL '$said', not $want"
	echo "$url"
}

# pg_edge RELEASE: whether RELEASE is the first or the last of MATRIX_PG.
pg_edge() {
	local rels=($MATRIX_PG)
	[ "$1" = "${rels[0]}" ] || [ "$1" = "${rels[${#rels[@]} - 1]}" ]
}

# runs_on PKGAXIS CELLAXIS RELEASE: whether a package of PKGAXIS runs on the
# cell of CELLAXIS (pg or kafka) and RELEASE (its PostgreSQL).
runs_on() {
	case $1/$2 in
	both/* | pg/pg | kafka/kafka | edges/kafka) return 0 ;;
	edges/pg) pg_edge "$3" ;;
	*) return 1 ;;
	esac
}

# any_runs_on CELLAXIS RELEASE: whether any package runs on that cell.
any_runs_on() {
	local entry
	for entry in "${pkgs[@]}"; do
		runs_on "${entry##* }" "$1" "$2" && return 0
	done
	return 1
}

commits() { psql "$1" -XtAc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }

# cell NAME AXIS PGRELEASE PGPORT KAFKAVERSION KAFKAPORT: runs the axis's
# packages.
cell() {
	local name=$1 cellaxis=$2 rel=$3 port=$4 kv=$5 kp=$6
	local out="$dir/logs/$name" t0=$SECONDS
	mkdir -p "$out"
	local url
	url=$(pg_start "$rel" "$port" "$out/pg") || { echo "FAIL $name: no PostgreSQL" >"$out/result"; return 1; }
	local said
	said=$(psql "$url" -XtAc 'SHOW server_version' | awk '{print $1}')
	local before ok=0 p
	before=$(commits "$url")
	: >"$out/packages"
	local entry
	for entry in "${pkgs[@]}"; do
		set -- $entry
		p=$1
		runs_on "$2" "$cellaxis" "$rel" || continue
		local pkgname bin t1=$SECONDS rc=0
		pkgname=$(echo "${p#./}" | tr / _)
		bin="$dir/tests/$pkgname.test"
		# shellcheck disable=SC2086 # TESTFLAGS is a list
		(cd "$root/$p" && env TEST_DATABASE_URL="$url" TEST_KAFKA_BROKERS="127.0.0.1:$kp" KAFKA_VERSION="$kv" CI=true \
			"$GO" tool test2json -p "${p#./}" "$bin" -test.v=test2json -test.count=1 -test.timeout=20m \
			-test.skip="$MATRIX_SKIP" ${TESTFLAGS:-} 2>&1 | "$dir/bin/testsum" >"$out/$pkgname.log") || rc=$?
		local counts
		counts=$(tail -1 "$out/$pkgname.log" | sed -n 's/^tests: //p')
		# A package that ran no test on this cell tested nothing on it.
		case $counts in "" | "0 passed"*) rc=1 ;; esac
		if [ $rc -ne 0 ]; then ok=1; fi
		printf '%s\t%s\t%ss\t%s\n' "${p#./}" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" $((SECONDS - t1)) "${counts:-no count}" >>"$out/packages"
	done
	local after
	after=$(commits "$url")
	kill "$(cat "$out/pg/pid")" 2>/dev/null || true
	if [ $((after - before)) -lt 100 ]; then
		echo "FAIL $name: PostgreSQL $said committed only $((after - before)) transactions: the tests did not run on it" >"$out/result"
		return 1
	fi
	local verdict=ok
	[ $ok -eq 0 ] || verdict=FAIL
	echo "$verdict $name: PostgreSQL $said (port $port, $((after - before)) commits), Kafka $kv (port $kp), $((SECONDS - t0))s" >"$out/result"
	return $ok
}

# The cells: the Kafka axis with the machine's PostgreSQL, then the
# PostgreSQL axis with Kafka at its default, its first and last releases
# before the others. They start in that order, the cells that run the most
# packages first, so that the last to start are short ones.
# A cell that no package runs on is left out: it would test nothing.
cells=()
i=0
for kv in $MATRIX_KAFKA; do
	any_runs_on kafka machine || break
	cells+=("kafka-$kv kafka machine $((pgport + i)) $kv")
	i=$((i + 1))
done
for edges in yes no; do
	for rel in $MATRIX_PG; do
		edge=no
		if pg_edge "$rel"; then edge=yes; fi
		[ "$edge" = "$edges" ] && any_runs_on pg "$rel" || continue
		cells+=("pg-$rel pg $rel $((pgport + i)) $default_kafka")
		i=$((i + 1))
	done
done

[ ${#cells[@]} -gt 0 ] || die "no cells: MATRIX_PG and MATRIX_KAFKA are both empty, or no package of MATRIX_PKGS runs on their axes"

# One broker per Kafka version that a cell needs.
kversions=$( (for c in "${cells[@]}"; do set -- $c; echo "$5"; done) | awk '!seen[$0]++')
declare -A kports
j=0
for kv in $kversions; do
	kafka_start "$kv" $((kport + j))
	kports[$kv]=$((kport + j))
	j=$((j + 1))
done

echo "matrix: ${#cells[@]} cells, $MATRIX_JOBS at once; packages: $MATRIX_PKGS"
# Each cell has a PostgreSQL server of its own (a port of its own); the
# cells of one Kafka version share its broker (tests make their own topics
# and groups).
running=0
fail=0
for c in "${cells[@]}"; do
	set -- $c
	if [ "$running" -ge "$MATRIX_JOBS" ]; then
		wait -n || fail=1
		running=$((running - 1))
	fi
	echo "matrix: start $1"
	cell "$1" "$2" "$3" "$4" "$5" "${kports[$5]}" &
	running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
	wait -n || fail=1
	running=$((running - 1))
done

echo
echo "== matrix: which packages ran on which versions"
for c in "${cells[@]}"; do
	set -- $c
	out="$dir/logs/$1"
	if [ -f "$out/result" ]; then cat "$out/result"; else echo "FAIL $1: no result"; fi
	[ -f "$out/packages" ] && sed 's/^/    /' "$out/packages" | column -t -s $'\t' | sed 's/^/    /'
done
failed_logs=$(grep -l "^failed tests\|^FAIL" "$dir"/logs/*/*.log 2>/dev/null || true)
for f in $failed_logs; do
	echo
	echo "== $f"
	cat "$f"
done
echo "matrix: $((SECONDS - started))s in all, logs in $dir/logs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit $fail

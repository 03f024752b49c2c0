#!/usr/bin/env bash
# Builds, without any registry, the images that the tests (testcontainers-go)
# and docker-compose.yml use, under the names they use:
#
#   postgres:15-alpine            PostgreSQL 15 from Debian packages (docker/postgres)
#   apache/kafka:4.4.0            Kafka 4.4.0 jars from Maven Central on Debian's OpenJDK 17 (docker/kafka)
#   exactly/ledger-consumer:dev   the ledger worker, compiled on this machine (docker/ledger-consumer/local.Dockerfile)
#
# on one local base image:
#
#   exactly-local/debian:bookworm  a minimal Debian (debootstrap --variant=minbase), docker import-ed
#
# The worker is compiled by the machine's Go, with the machine's module and
# build caches, and copied into a thin image: compiling it inside a container
# would start from cold caches (minutes on two cores).
# docker/ledger-consumer/Dockerfile, which compiles in a golang image, stays
# the build for machines with a registry (docker compose up --build).
#
# The names shadow the official images on this machine; on a machine with a
# registry, pull the official ones instead. Packages come from the machine's
# Debian mirror, the jars from Maven Central (docker/kafka/pom.xml), the Go
# modules from GOPROXY. Everything is cached: the debootstrap tree and the jars
# under ${XDG_CACHE_HOME:-~/.cache}/exactly/docker, and an image whose inputs
# have not changed (label dev.exactly.inputs) is not built again, so a second
# run takes seconds. The images build side by side once the base is there.
# Builds run on the host network (docker build --network host), so the engine
# needs no bridge.
#
#   scripts/docker-images.sh [--force] [postgres|kafka|ledger-consumer ...]
#
# Needs a running Docker engine (scripts/docker-engine.sh start), debootstrap
# (installed when missing, as root), Maven and Go.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/exactly/docker
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=exactly-local/debian:$suite
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$root/docker/kafka/pom.xml")
force=false

say() { echo "docker-images: $*" >&2; }
die() { say "$*"; exit 1; }

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# inputs FILE... prints a hash of the files' contents and names.
inputs() { (cd "$root" && sha256sum "$@" && echo "$base_id") | sha256sum | cut -c1-16; }

# fresh IMAGE HASH: the image exists and was built from these inputs.
fresh() {
	! $force && have_image "$1" &&
		[ "$(docker image inspect -f '{{index .Config.Labels "dev.exactly.inputs"}}' "$1")" = "$2" ]
}

build() { # build IMAGE HASH CONTEXT [docker build args...]
	local image=$1 hash=$2 ctx=$3
	shift 3
	say "building $image"
	local t0=$SECONDS
	docker build -q --network host --label "dev.exactly.inputs=$hash" -t "$image" "$@" "$ctx" >/dev/null
	say "built $image in $((SECONDS - t0))s"
}

debian() {
	if ! $force && have_image "$base"; then
		return 0
	fi
	local tarball=$cache/debian-$suite-minbase.tar
	if [ ! -s "$tarball" ]; then
		[ "$(id -u)" = 0 ] || die "debootstrap needs root"
		if ! command -v debootstrap >/dev/null; then
			say "installing debootstrap"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null ||
				die "could not install debootstrap (apt-get install -y debootstrap)"
		fi
		say "debootstrap $suite from $mirror (a few minutes, once)"
		rm -rf "$cache/rootfs.tmp"
		debootstrap --variant=minbase "$suite" "$cache/rootfs.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
			{ tail -20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
		rm -rf "$cache/rootfs.tmp"/var/cache/apt/archives/*.deb "$cache/rootfs.tmp"/var/lib/apt/lists/*
		# No daemons start during image builds, and dpkg does not fsync
		# each file it unpacks there (as in the official Debian images).
		printf '#!/bin/sh\nexit 101\n' >"$cache/rootfs.tmp/usr/sbin/policy-rc.d"
		chmod 755 "$cache/rootfs.tmp/usr/sbin/policy-rc.d"
		echo force-unsafe-io >"$cache/rootfs.tmp/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
		tar --numeric-owner -C "$cache/rootfs.tmp" -cf "$tarball.tmp" .
		mv "$tarball.tmp" "$tarball"
		rm -rf "$cache/rootfs.tmp"
	fi
	say "importing $base"
	docker import --change 'CMD ["bash"]' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		"$tarball" "$base" >/dev/null
}

postgres() {
	local hash
	hash=$(inputs docker/postgres/Dockerfile docker/postgres/docker-entrypoint.sh)
	fresh postgres:15-alpine "$hash" && return 0
	build postgres:15-alpine "$hash" "$root/docker/postgres" --build-arg "BASE=$base"
}

kafka() {
	local image=apache/kafka:$kafka_version libs=$cache/kafka-libs-$kafka_version
	if [ ! -f "$libs/.complete" ]; then
		command -v mvn >/dev/null || die "Maven is not installed: it fetches Kafka $kafka_version from Maven Central (apt-get install maven)"
		say "fetching Kafka $kafka_version from Maven Central"
		rm -rf "$libs.tmp"
		mvn -q -B -Dstyle.color=never -f "$root/docker/kafka/pom.xml" dependency:copy-dependencies \
			-DincludeScope=runtime -DoutputDirectory="$libs.tmp" >&2 || die "could not fetch Kafka $kafka_version with Maven"
		rm -rf "$libs"
		mv "$libs.tmp" "$libs"
		touch "$libs/.complete"
	fi
	local hash
	hash=$(inputs docker/kafka/Dockerfile docker/kafka/pom.xml docker/kafka/run docker/kafka/bin/* docker/kafka/config/*)
	fresh "$image" "$hash" && return 0
	local ctx=$cache/kafka-context
	rm -rf "$ctx"
	mkdir -p "$ctx"
	cp -r "$root/docker/kafka/." "$ctx/"
	cp -r "$libs" "$ctx/libs"
	rm -f "$ctx/libs/.complete"
	build "$image" "$hash" "$ctx" --build-arg "BASE=$base"
	rm -rf "$ctx"
}

ledger_consumer() {
	local image=exactly/ledger-consumer:dev ctx=$cache/ledger-consumer-context hash
	rm -rf "$ctx"
	mkdir -p "$ctx"
	# With the go command's default flags, the compiled packages that go vet
	# and go build left in the build cache serve (make lint runs first in
	# CI): linking is what is left. A binary that cannot run on the base
	# (a libc newer than the base's) is compiled again without cgo.
	say "compiling the worker (go build)"
	(cd "$root" && go build -o "$ctx/ledger-consumer" ./examples/ledger-consumer) ||
		die "go build ./examples/ledger-consumer failed"
	if ! docker run --rm --network none -v "$ctx:/x:ro" "$base" /x/ledger-consumer help >/dev/null 2>&1; then
		say "the worker does not run on $base; compiling it again with CGO_ENABLED=0"
		(cd "$root" && CGO_ENABLED=0 go build -o "$ctx/ledger-consumer" ./examples/ledger-consumer) ||
			die "CGO_ENABLED=0 go build ./examples/ledger-consumer failed"
	fi
	cp "$root/docker/ledger-consumer/local.Dockerfile" "$ctx/Dockerfile"
	hash=$( (sha256sum "$ctx/ledger-consumer" "$ctx/Dockerfile" | cut -d' ' -f1; echo "$base_id") | sha256sum | cut -c1-16)
	if ! fresh "$image" "$hash"; then
		build "$image" "$hash" "$ctx" --build-arg "BASE=$base"
	fi
	rm -rf "$ctx"
}

targets=()
for a in "$@"; do
	case "$a" in
	--force) force=true ;;
	postgres | kafka | ledger-consumer) targets+=("$a") ;;
	*) die "usage: $0 [--force] [postgres|kafka|ledger-consumer ...]" ;;
	esac
done
[ ${#targets[@]} -gt 0 ] || targets=(postgres kafka ledger-consumer)

docker info >/dev/null 2>&1 || die "no Docker engine answers (scripts/docker-engine.sh start)"
mkdir -p "$cache"
t0=$SECONDS
debian
base_id=$(docker image inspect -f '{{.Id}}' "$base")
# The builds wait mostly on the network and on dpkg: run them side by side.
pids=()
for t in "${targets[@]}"; do
	case "$t" in
	postgres) postgres & ;;
	kafka) kafka & ;;
	ledger-consumer) ledger_consumer & ;;
	esac
	pids+=("$!")
done
failed=0
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || { say "${targets[$i]} failed"; failed=1; }
done
[ $failed = 0 ] || exit 1
say "images ready in $((SECONDS - t0))s"

#!/usr/bin/env bash
# Builds, without any registry, the images that the tests (testcontainers-go)
# and docker-compose.yml use, under the names they use:
#
#   postgres:15-alpine            PostgreSQL 15 from Debian packages (docker/postgres)
#   apache/kafka:4.4.0            Kafka 4.4.0 jars from Maven Central on Debian's OpenJDK 17 (docker/kafka)
#   exactly/ledger-consumer:dev   the ledger worker, built from this repository (docker/ledger-consumer)
#
# on two local base images:
#
#   exactly-local/debian:bookworm  a minimal Debian (debootstrap --variant=minbase), docker import-ed
#   exactly-local/golang:<go>      this machine's Go toolchain on that base (docker/golang)
#
# The names shadow the official images on this machine; on a machine with a
# registry, pull the official ones instead. Packages come from the machine's
# Debian mirror, the jars from Maven Central (docker/kafka/pom.xml), the Go
# modules from GOPROXY. Everything is cached: the debootstrap tree and the jars
# under ${XDG_CACHE_HOME:-~/.cache}/exactly/docker, and an image whose inputs
# have not changed (label dev.exactly.inputs) is not built again, so a second
# run takes seconds. Builds run on the host network (docker build --network
# host), so the engine needs no bridge.
#
#   scripts/docker-images.sh [--force] [postgres|kafka|ledger-consumer ...]
#
# Needs a running Docker engine (scripts/docker-engine.sh start), debootstrap,
# Maven and Go.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/exactly/docker
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=exactly-local/debian:$suite
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$root/docker/kafka/pom.xml")
go_version=$(go env GOVERSION)
golang=exactly-local/golang:${go_version#go}
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
		# No daemons start during image builds.
		printf '#!/bin/sh\nexit 101\n' >"$cache/rootfs.tmp/usr/sbin/policy-rc.d"
		chmod 755 "$cache/rootfs.tmp/usr/sbin/policy-rc.d"
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

golang() {
	local goroot hash certs=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
	[ -s "$certs" ] || die "no certificate bundle at $certs (set SSL_CERT_FILE)"
	goroot=$(go env GOROOT)
	hash=$(echo "$go_version $(sha256sum <"$certs") $(inputs docker/golang/Dockerfile)" | sha256sum | cut -c1-16)
	fresh "$golang" "$hash" && return 0
	local ctx=$cache/golang-context
	rm -rf "$ctx"
	mkdir -p "$ctx"
	cp "$root/docker/golang/Dockerfile" "$ctx/"
	cp "$certs" "$ctx/ca-certificates.crt"
	tar -C "$(dirname "$goroot")" --transform "s,^$(basename "$goroot"),go," \
		--exclude="$(basename "$goroot")/test" --exclude="$(basename "$goroot")/pkg/obj" \
		-cf "$ctx/go.tar" "$(basename "$goroot")"
	build "$golang" "$hash" "$ctx" --build-arg "BASE=$base"
	rm -rf "$ctx"
}

ledger_consumer() {
	golang
	# The repository changes often: let the build's layer cache decide (the
	# modules layer is reused while go.mod and go.sum stay the same).
	say "building exactly/ledger-consumer:dev"
	local t0=$SECONDS deps
	deps=$(cd "$root" && CGO_ENABLED=0 go list -deps -f '{{if not .Standard}}{{if .Module}}{{if not .Module.Main}}{{.ImportPath}}{{end}}{{end}}{{end}}' ./examples/ledger-consumer | tr '\n' ' ')
	docker build -q --network host -f "$root/docker/ledger-consumer/Dockerfile" -t exactly/ledger-consumer:dev \
		--build-arg "GO_IMAGE=$golang" --build-arg "BASE=$base" --build-arg "DEPS=$deps" \
		--build-arg "GOPROXY=$(go env GOPROXY)" "$root" >/dev/null
	say "built exactly/ledger-consumer:dev in $((SECONDS - t0))s"
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
for t in "${targets[@]}"; do
	case "$t" in
	postgres) postgres ;;
	kafka) kafka ;;
	ledger-consumer) ledger_consumer ;;
	esac
done
say "images ready in $((SECONDS - t0))s"

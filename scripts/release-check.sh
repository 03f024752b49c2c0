#!/usr/bin/env bash
# make release-check: installs the published modules as a user would, from a
# module proxy built from this working tree for a candidate version.
#
#  1. The tree: no published module's go.mod has a replace directive or
#     requires a module of this repository that is not published; no
#     committed file is over 1 MB unless listed in
#     scripts/release-check/allow-large.txt.
#  2. A file-based module proxy (GOPROXY=file://…) serving the published
#     modules at $RELEASE_VERSION (default: the version the sub-modules
#     require), zipped by golang.org/x/mod/zip (tools/release/cmd/modproxy)
#     from the tracked and untracked, not ignored files.
#  3. In a fresh module outside the repository, with GOWORK=off,
#     GOFLAGS=-mod=mod, GOSUMDB=off, an empty GOPATH and module cache and
#     GOPROXY=file://<proxy>,https://proxy.golang.org (the real proxy serves
#     only the third-party modules): the commands of README.md's Install
#     section, line by line, as written; the README's quick start copied out
#     of README.md, built and vetted; a program on both plugins built and
#     run; the test kit's example test (worker/workertest) built and run;
#     `replay --help` from the go install.
#  4. A report: each published module, its version and direct dependencies,
#     and the build graph a user of the root module downloads
#     (go mod download -json: modules and MB).
#
# RELEASE_CHECK_MODCACHE=DIR keeps the third-party modules between runs in
# DIR (this repository's modules are removed from it at every run, so they
# always come from the proxy just built); unset, the module cache is an
# empty temporary directory, as on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)

# The published modules (RELEASING.md). Every other module of go.work is
# test-only or internal, never required by a published one.
published=(. plugin/eprom plugin/eotel cmd/replay embedpg kgopubsub worker/workertest)
repo=github.com/exactly-go/exactly

fail() { echo "release-check: $*" >&2; exit 1; }
modpath() { go mod edit -json "$1/go.mod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Module"]["Path"])'; }

version=${RELEASE_VERSION:-$(go mod edit -json plugin/eprom/go.mod | python3 -c '
import json, sys
print(next(r["Version"] for r in json.load(sys.stdin)["Require"] if r["Path"] == "github.com/exactly-go/exactly"))')}
echo "== candidate $version"

echo "== the tree"
pubpaths=()
for m in "${published[@]}"; do pubpaths+=("$(modpath "$m")"); done
problems=0
for m in "${published[@]}"; do
	json=$(go mod edit -json "$m/go.mod")
	bad=$(python3 -c '
import json, sys
mod = json.loads(sys.argv[1]); pub = set(sys.argv[3:]); repo = sys.argv[2]
for r in mod.get("Replace") or []:
    print("replace directive: %s => %s" % (r["Old"]["Path"], r["New"]["Path"]))
for r in mod.get("Require") or []:
    p = r["Path"]
    if (p == repo or p.startswith(repo + "/")) and p not in pub:
        print("requires %s %s, a module that is not published" % (p, r["Version"]))
' "$json" "$repo" "${pubpaths[@]}")
	if [ -n "$bad" ]; then
		echo "$bad" | sed "s|^|$m/go.mod: |" >&2
		problems=1
	fi
done
allow=$(grep -v '^#' scripts/release-check/allow-large.txt | sed '/^$/d' || true)
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue
	size=$(stat -c %s "$f")
	if [ "$size" -gt 1048576 ] && ! grep -qxF "$f" <<<"$allow"; then
		echo "$f: $size bytes committed, over 1 MB and not in scripts/release-check/allow-large.txt" >&2
		problems=1
	fi
done < <(git ls-files -z)
[ "$problems" = 0 ] || fail "the tree is not releasable (above)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/release-check.XXXXXX")
cleanup() { chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

echo "== module proxy"
# A copy of what a tag would hold: tracked files and untracked ones that are
# not ignored, as they are in the working tree.
mkdir -p "$tmp/tree" "$tmp/proxy" "$tmp/bin"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
	tar -c --null -T - | tar -x -C "$tmp/tree"
(cd tools/release && GOWORK=off go build -o "$tmp/bin/modproxy" ./cmd/modproxy)
(cd "$tmp/tree" && "$tmp/bin/modproxy" -out "$tmp/proxy" -version "$version" "${published[@]}")

# The user's environment: nothing of this machine's Go set-up but the build
# cache (content-addressed) and, when asked, the third-party modules.
export GOWORK=off GOFLAGS=-mod=mod GOSUMDB=off GONOSUMDB= GONOSUMCHECK= GOPRIVATE= GONOPROXY=
export GOPROXY="file://$tmp/proxy,https://proxy.golang.org"
export GOPATH="$tmp/gopath"
if [ -n "${RELEASE_CHECK_MODCACHE:-}" ]; then
	mkdir -p "$RELEASE_CHECK_MODCACHE"
	export GOMODCACHE=$(cd "$RELEASE_CHECK_MODCACHE" && pwd)
	for d in "$GOMODCACHE/github.com/exactly-go" "$GOMODCACHE/cache/download/github.com/exactly-go"; do
		[ -e "$d" ] && chmod -R u+w "$d" && rm -rf "$d"
	done
else
	export GOMODCACHE="$tmp/gopath/pkg/mod"
fi
export GOBIN="$tmp/gopath/bin"
export PATH="$GOBIN:$PATH"

echo "== README.md's Install section, in a fresh module"
install=$(awk '/^## Install/{s=1; next} s && /^## /{exit} s && /^```/{if (b) exit; b=1; next} s && b' README.md |
	sed 's/[[:space:]]*#.*$//' | sed '/^[[:space:]]*$/d')
[ -n "$install" ] || fail "README.md has no commands in its Install section"
grep -q "^go get $repo@" <<<"$install" || fail "README.md's Install section does not go get the library"
grep -q "^go install $repo/cmd/replay@" <<<"$install" || fail "README.md's Install section does not go install cmd/replay"
mkdir -p "$tmp/app"
cd "$tmp/app"
go mod init example.com/app >/dev/null 2>&1
while IFS= read -r cmd; do
	case "$cmd" in
	"go get "* | "go install "*) ;;
	*) fail "README.md's Install section has a command release-check does not run: $cmd" ;;
	esac
	echo "\$ $cmd"
	if ! eval "$cmd" >"$tmp/out" 2>&1; then
		cat "$tmp/out" >&2
		fail "$cmd failed"
	fi
	grep -v '^go: downloading' "$tmp/out" || true
done <<<"$install"
for p in "${pubpaths[@]}"; do
	[ "$p" = "$repo/cmd/replay" ] && continue
	got=$(go list -m -f '{{.Version}}' "$p" 2>/dev/null) || fail "$p is not in the fresh module's build list after the Install commands"
	[ "$got" = "$version" ] || fail "$p resolved to $got, not the candidate $version"
done

echo "== the README's quick start"
mkdir -p quickstart
awk '/^## Quick start/{s=1; next} s && /^## /{exit} s && /^```go$/{b=1; next} s && b && /^```$/{exit} s && b' \
	"$root/README.md" >quickstart/main.go
[ -s quickstart/main.go ] || fail "README.md's Quick start has no Go block"
go build -o /dev/null ./quickstart || fail "the README's quick start does not build"
go vet ./quickstart || fail "the README's quick start does not pass go vet"

echo "== a program on both plugins"
mkdir -p plugins
cp "$root/scripts/release-check/plugins.go.txt" plugins/main.go
go build -o "$tmp/bin/plugins" ./plugins || fail "the plugins program does not build"
go vet ./plugins || fail "the plugins program does not pass go vet"
"$tmp/bin/plugins"

echo "== a test on the test kit"
# worker/workertest's example test, as a user's: built against the published
# modules and run (on TEST_DATABASE_URL and TEST_KAFKA_BROKERS when set, else
# on a throwaway PostgreSQL and the in-process broker).
mkdir -p kittest
cp "$root/worker/workertest/example_test.go" kittest/
go vet ./kittest || fail "the test kit's example does not pass go vet"
go test -count=1 -run '^TestTopUps$' ./kittest || fail "the test kit's example test failed"

echo "== replay --help"
help=$(replay --help) || fail "replay --help exited with $?"
head -3 <<<"$help"

echo "== published modules"
for m in "${published[@]}"; do
	deps=$(go mod edit -json "$tmp/tree/$m/go.mod" | python3 -c '
import json, sys
print(" ".join("%s@%s" % (r["Path"], r["Version"]) for r in json.load(sys.stdin).get("Require") or [] if not r.get("Indirect")))')
	echo "$(modpath "$tmp/tree/$m") $version"
	echo "  direct: $deps"
done

echo "== build graph"
graph() { # in a module: what go mod download -json fetches
	go mod download -json | python3 -c '
import json, os, sys
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; n = 0; size = 0
while True:
    while i < len(s) and s[i].isspace(): i += 1
    if i >= len(s): break
    m, i = dec.raw_decode(s, i); n += 1
    if m.get("Error"): print("error:", m["Path"], m["Error"], file=sys.stderr); sys.exit(1)
    if m.get("Zip"): size += os.path.getsize(m["Zip"])
print("%d modules, %.1f MB of module zips" % (n, size / 1e6))'
}
echo "with both plugins (this module): $(graph)"
mkdir -p "$tmp/rootonly" && cd "$tmp/rootonly"
go mod init example.com/rootonly >/dev/null 2>&1
go get "$repo@$version" 2>&1 | grep -v '^go: downloading' || true
mkdir -p quickstart && cp "$tmp/app/quickstart/main.go" quickstart/ && go mod tidy >/dev/null 2>&1 || fail "go mod tidy failed in the root-only module"
echo "the root module and the quick start: $(graph)"

echo "== release-check passed in $(($(date +%s) - start))s"

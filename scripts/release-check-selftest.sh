#!/usr/bin/env bash
# Shows that make release-check fails on what it must refuse: in a clone of
# this repository's HEAD, each case is committed, release-check runs, and it
# must exit non-zero with the expected message.
#
#   replace   plugin/eprom/go.mod gets a replace directive back
#   example   cmd/replay requires examples/ledger-consumer again
#   large     a 2 MB file is committed
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/release-check-selftest.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
status=0
run_case() { # name, expected message, then the change as a shell command
	local name=$1 want=$2 change=$3 dir=$tmp/$1
	git clone -q . "$dir"
	(cd "$dir" && eval "$change" && git add -A && git -c user.name=t -c user.email=t@t commit -qm "$name")
	if out=$(cd "$dir" && scripts/release-check.sh 2>&1); then
		echo "FAIL $name: release-check passed"
		status=1
	elif grep -qF -- "$want" <<<"$out"; then
		echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
	else
		echo "FAIL $name: release-check failed without \"$want\":"
		echo "$out" | tail -5
		status=1
	fi
}
run_case replace "plugin/eprom/go.mod: replace directive: github.com/exactly-go/exactly => ../.." \
	'go mod edit -replace=github.com/exactly-go/exactly=../.. plugin/eprom/go.mod'
run_case example "cmd/replay/go.mod: requires github.com/exactly-go/exactly/examples/ledger-consumer" \
	'v=$(go mod edit -json cmd/replay/go.mod | awk -F"\"" "\$4 == \"github.com/exactly-go/exactly\" {getline; print \$4; exit}"); go mod edit -require=github.com/exactly-go/exactly/examples/ledger-consumer@$v cmd/replay/go.mod'
run_case large "big.bin: 2097152 bytes committed, over 1 MB" \
	'head -c 2097152 /dev/urandom >big.bin'
exit $status

#!/usr/bin/env bash
# The public API of each published module, one file each under api/
# (tools/release/cmd/apisurface): exported declarations without bodies or
# comments. `scripts/api.sh` (make api) rewrites them; `scripts/api.sh check`
# (part of make lint) fails when a committed file differs from the code, so
# that every change to the public surface shows in review.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-write}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd tools/release && GOWORK=off go build -o "$tmp/apisurface" ./cmd/apisurface)
stale=()
mkdir -p api
for m in . plugin/eprom plugin/eotel cmd/replay embedpg kgopubsub worker/workertest; do
	name=$(go mod edit -json "$m/go.mod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Module"]["Path"].removeprefix("github.com/exactly-go/").replace("/", "-"))')
	"$tmp/apisurface" "$m" >"$tmp/$name.txt"
	if [ "$mode" = check ]; then
		if ! cmp -s "$tmp/$name.txt" "api/$name.txt"; then
			diff -u "api/$name.txt" "$tmp/$name.txt" | head -40 || true
			stale+=("api/$name.txt")
		fi
	else
		cp "$tmp/$name.txt" "api/$name.txt"
	fi
done
if [ "${#stale[@]}" -gt 0 ]; then
	echo "the public API changed and ${stale[*]} does not say so (diff above): run 'make api' and commit the result" >&2
	exit 1
fi

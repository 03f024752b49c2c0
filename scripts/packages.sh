#!/usr/bin/env bash
# Prints the package patterns of every module of the workspace (go.work), as
# go test and go vet take them: ./... alone stops at the nested modules.
set -euo pipefail
cd "$(dirname "$0")/.."
"${GO:-go}" list -m -f '{{.Dir}}/...' | sed "s|^$PWD|.|" | tr '\n' ' '
echo

#!/usr/bin/env bash
# Static checks: go vet, golangci-lint (.golangci.yaml) and gofmt.
#
# golangci-lint is pinned; it is built once per version and Go toolchain
# into a cache outside the checkout (ONCEONLY_TOOLS, default
# ~/.cache/onceonly/tools), so a fresh clone on a machine that linted
# before does not build it again. `make test` does not run this: a
# newcomer's first test run does not wait for a linter to compile.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t packages < <(scripts/modules.sh)
go vet "${packages[@]}"
lint_version=v2.15.0
tools=${ONCEONLY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/onceonly/tools}
lint=$tools/golangci-lint
if ! "$lint" version 2>/dev/null | grep -F "version ${lint_version#v} built with $(go env GOVERSION) " >/dev/null; then
	echo "lint: building golangci-lint $lint_version into $tools (once per version and Go toolchain)" >&2
	mkdir -p "$tools"
	GOBIN="$tools" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$lint_version"
fi
"$lint" run "${packages[@]}"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt needed on: $unformatted" >&2
	exit 1
fi
echo "lint: clean"

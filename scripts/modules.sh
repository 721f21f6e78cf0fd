#!/usr/bin/env bash
# Prints the package pattern of every module of the workspace (go.work), one
# per line: ./... for the library, ./cmd/... for the commands, and so on.
# The library's module holds only what a user of the root package needs;
# the commands, the integrations with heavy dependencies (River, the
# brokers, Watermill), the chaos suite and the container starter are
# modules of their own, so a user's `go mod tidy` pulls none of theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
go list -m -f '{{.Dir}}' | sed -e "s#^$PWD\$#.#" -e "s#^$PWD/#./#" -e 's#$#/...#'

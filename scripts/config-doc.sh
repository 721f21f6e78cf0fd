#!/usr/bin/env bash
# Regenerates docs/configuration.md from the commands' -h output (its
# introduction is kept). The cmd tests fail when the two drift apart.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin && go build -o bin/ ./cmd/...
intro=$(sed '/^## api$/,$d' docs/configuration.md)
{
	printf '%s\n' "$intro"
	for c in api relay reconciler gateway consumer; do
		printf '\n## %s\n\n```\n' "$c"
		env -i bin/$c -h 2>&1 # no environment: the defaults as shipped
		printf '```\n'
	done
} > docs/configuration.md.new
mv docs/configuration.md.new docs/configuration.md

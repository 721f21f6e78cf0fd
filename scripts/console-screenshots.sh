#!/usr/bin/env bash
# Retakes the console's screenshots in docs/images/ (docs/console.md shows
# them): the browser test (console/browsertest) drives the console in
# Debian's headless Chromium and saves them. Unless TEST_DATABASE_URL and
# TEST_REDIS_URL are set, it starts a Postgres and a Redis of its own under
# .data/screens on ports 61632 and 61679 and stops them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh tools
started=
cleanup() { if [ -n "$started" ]; then scripts/services.sh stop .data/screens; fi; }
trap cleanup EXIT
if [ -z "${TEST_DATABASE_URL:-}" ] || [ -z "${TEST_REDIS_URL:-}" ]; then
	started=1
	scripts/services.sh start .data/screens 61632 61679 test
	export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:61632/postgres?sslmode=disable"
	export TEST_REDIS_URL="redis://127.0.0.1:61679/0"
fi
shots=$(mktemp -d)
TEST_ARTIFACTS_DIR=$shots go test -count=1 -run '^TestConsoleInABrowser$' ./console/browsertest
mkdir -p docs/images
cp "$shots"/console-*.png docs/images/
rm -rf "$shots"
echo "screenshots in docs/images/: $(cd docs/images && ls console-*.png | tr '\n' ' ')"

#!/usr/bin/env bash
# Fuzzes the demo api end to end (FuzzAPI: arbitrary methods, paths, keys,
# content types, credentials and bodies through the real handler on real
# Postgres and Redis), FUZZ_EXECS executions (default 1000000), then the
# engine's own fuzz targets briefly. Uses TEST_DATABASE_URL and
# TEST_REDIS_URL when set; else starts its own servers under .data/fuzz on
# ports 55532/56479 and stops them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
execs=${FUZZ_EXECS:-1000000}
if [ -z "${TEST_DATABASE_URL:-}" ] || [ -z "${TEST_REDIS_URL:-}" ]; then
	scripts/services.sh start .data/fuzz 55532 56479 test
	trap 'scripts/services.sh stop .data/fuzz' EXIT
	export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:55532/postgres?sslmode=disable"
	export TEST_REDIS_URL="redis://127.0.0.1:56479/0"
fi
go test -run '^$' -fuzz '^FuzzAPI$' -fuzztime "${execs}x" ./demo/payments
go test -run '^$' -fuzz '^FuzzCanonicalJSON$' -fuzztime 60s .
go test -run '^$' -fuzz '^FuzzValidateKey$' -fuzztime 30s .

#!/usr/bin/env bash
# Runs the whole test suite with -race on real Postgres and Redis.
#
# Unless TEST_DATABASE_URL and TEST_REDIS_URL are set, it installs what is
# missing (Debian packages), starts a Postgres 15 and a Redis of its own under
# .data/test on ports 55432 and 56379 (TEST_PG_PORT, TEST_REDIS_PORT), and
# stops them afterwards. Unless TEST_REDIS_CLUSTER_URL is set, it does the
# same for a three-master Redis Cluster on ports 56380-56382
# (TEST_REDIS_CLUSTER_PORT). Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."

started=
if [ -z "${TEST_DATABASE_URL:-}" ] || [ -z "${TEST_REDIS_URL:-}" ]; then
	pg_port=${TEST_PG_PORT:-55432}
	redis_port=${TEST_REDIS_PORT:-56379}
	scripts/services.sh start .data/test "$pg_port" "$redis_port" test
	started=1
	export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
	export TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
fi
if [ -z "${TEST_REDIS_CLUSTER_URL:-}" ]; then
	p=${TEST_REDIS_CLUSTER_PORT:-56380}
	scripts/services.sh cluster .data/test "$p" test
	started=1
	export TEST_REDIS_CLUSTER_URL="redis://127.0.0.1:$p?addr=127.0.0.1:$((p + 1))&addr=127.0.0.1:$((p + 2))"
fi
cleanup() { [ -n "$started" ] && scripts/services.sh stop .data/test; }
trap cleanup EXIT

go vet ./...
# golangci-lint (.golangci.yaml) at a pinned version, installed into
# .data/tools once per version and Go toolchain.
lint_version=v2.15.0
lint=.data/tools/golangci-lint
if ! "$lint" version 2>/dev/null | grep -F "version ${lint_version#v} built with $(go env GOVERSION) " >/dev/null; then
	GOBIN="$PWD/.data/tools" go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$lint_version"
fi
"$lint" run ./...
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt needed on: $unformatted" >&2
	exit 1
fi
go test -race -count=1 -timeout 15m "$@" ./...
if [ $# -eq 0 ]; then
	# Benchmark smoke: every benchmark runs once, small (make bench-* for figures).
	BENCH_EVENTS=2000 BENCH_RATE=200 BENCH_SECONDS=1 go test -run '^$' -bench . -benchtime 1x ./relay
fi

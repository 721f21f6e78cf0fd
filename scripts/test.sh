#!/usr/bin/env bash
# Runs the whole test suite with -race on real Postgres and Redis.
#
# Unless TEST_DATABASE_URL and TEST_REDIS_URL are set, it installs what is
# missing (Debian packages), starts a Postgres 15 and a Redis of its own under
# .data/test on ports 61532 and 61579 (TEST_PG_PORT, TEST_REDIS_PORT), and
# stops them afterwards. Unless TEST_REDIS_CLUSTER_URL is set, it does the
# same for a three-master Redis Cluster on ports 61580-61582
# (TEST_REDIS_CLUSTER_PORT). Unless TEST_REDIS_SENTINEL_URL is set, it starts
# a Redis primary, its replica and three Sentinels on ports 61390-61394
# (TEST_REDIS_SENTINEL_PORT). Every default port lies above the kernel's
# ephemeral range (32768-60999), where no outgoing connection of another
# process can hold it when the server binds. Unless TEST_PGBOUNCER_URL is set, it starts
# PgBouncer (installed when missing) in transaction mode on port 61432
# (TEST_PGBOUNCER_PORT) in front of the test Postgres. Unless TEST_NATS_URL is
# set, it starts nats-server (installed when missing) with JetStream on port
# 61442 (TEST_NATS_PORT). Unless TEST_AMQP_URL is set, it starts a RabbitMQ
# node of its own (rabbitmq-server, installed when missing) on port 61600
# (TEST_AMQP_PORT; its Erlang ports are the next seven) and points
# TEST_RABBITMQCTL at the rabbitmqctl of that node, which the tests that
# close connections from the broker's side run. It installs Chromium and
# promtool when missing (scripts/services.sh tools). Extra arguments go to
# `go test`; TEST_PACKAGES (space-separated, e.g. ./chaos/...) tests those
# packages only, and then runs nothing after them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every module of the workspace (go.work): the library, the commands, the
# integrations with heavy dependencies, the chaos suite; not the Citus
# tests, which need a Citus cluster (make test-citus). TEST_PACKAGES: those
# packages only.
if [ -n "${TEST_PACKAGES:-}" ]; then
	read -ra packages <<<"$TEST_PACKAGES"
else
	mapfile -t packages < <(scripts/modules.sh | grep -vx './citus/...')
fi

# The test binaries compile while the services below install and start
# (-exec true: built, not run), so the run itself finds them in the build
# cache. A compile error shows in the run.
go test -race -count=1 -run '^$' -exec true "${packages[@]}" >/dev/null 2>&1 &
compiling=$!

started=
# Set before any service starts, so one that fails to start does not leave
# the others running.
cleanup() {
	kill "$compiling" 2>/dev/null || true
	if [ -n "$started" ]; then scripts/services.sh stop .data/test; fi
}
trap cleanup EXIT
if [ -z "${TEST_DATABASE_URL:-}" ] || [ -z "${TEST_REDIS_URL:-}" ]; then
	pg_port=${TEST_PG_PORT:-61532}
	redis_port=${TEST_REDIS_PORT:-61579}
	started=1
	scripts/services.sh start .data/test "$pg_port" "$redis_port" test
	export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
	export TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
fi
if [ -z "${TEST_REDIS_CLUSTER_URL:-}" ]; then
	p=${TEST_REDIS_CLUSTER_PORT:-61580}
	started=1
	scripts/services.sh cluster .data/test "$p" test
	export TEST_REDIS_CLUSTER_URL="redis://127.0.0.1:$p?addr=127.0.0.1:$((p + 1))&addr=127.0.0.1:$((p + 2))"
fi
if [ -z "${TEST_REDIS_SENTINEL_URL:-}" ]; then
	p=${TEST_REDIS_SENTINEL_PORT:-61390}
	started=1
	scripts/services.sh sentinel .data/test "$p" test
	export TEST_REDIS_SENTINEL_URL="redis://127.0.0.1:$((p + 2))?master_name=onceonly&addr=127.0.0.1:$((p + 3))&addr=127.0.0.1:$((p + 4))"
fi
if [ -z "${TEST_PGBOUNCER_URL:-}" ]; then
	# PgBouncer in transaction mode in front of that Postgres: the commands'
	# tests run through it too (docs/operations.md#deployments).
	p=${TEST_PGBOUNCER_PORT:-61432}
	pg_addr=$(sed -E 's#^[a-z]+://([^@/]*@)?([^/?]*).*#\2#' <<<"$TEST_DATABASE_URL")
	started=1
	scripts/services.sh pgbouncer .data/test "${pg_addr##*:}" "$p" "${pg_addr%:*}"
	export TEST_PGBOUNCER_URL="postgres://postgres@127.0.0.1:$p/postgres?sslmode=disable"
fi
if [ -z "${TEST_AMQP_URL:-}" ]; then
	p=${TEST_AMQP_PORT:-61600}
	started=1
	scripts/services.sh rabbitmq .data/test "$p"
	export TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:$p/"
	export TEST_RABBITMQCTL=${TEST_RABBITMQCTL:-$PWD/.data/test/rabbitmq/rabbitmqctl}
fi
if [ -z "${TEST_NATS_URL:-}" ]; then
	# NATS JetStream for oncenats; each test declares streams of its own.
	p=${TEST_NATS_PORT:-61442}
	started=1
	scripts/services.sh nats .data/test "$p"
	export TEST_NATS_URL="nats://127.0.0.1:$p"
fi

# Chromium (the console's browser test) and promtool (the alert rules'
# tests), installed when missing.
scripts/services.sh tools

wait "$compiling" || true
# As many test binaries at once as there are cores (go test's default):
# four at once on two cores overloaded the machine, and tests sized for a
# busy laptop lost leases.
go test -race -count=1 -timeout 15m "$@" "${packages[@]}"
if [ $# -eq 0 ] && [ -z "${TEST_PACKAGES:-}" ]; then
	scripts/publish-check.sh # the modules publish as tags would: GOWORK=off builds, go get each, go install (docs/development.md)
	# Benchmark smoke: every benchmark runs once, small (make bench-* for figures).
	BENCH_EVENTS=2000 BENCH_RATE=200 BENCH_SECONDS=1 go test -run '^$' -bench . -benchtime 1x ./relay
	# The side-by-side benchmark, one second per variant: ratios printed, no
	# threshold (make bench-compare for figures).
	BENCH_SECONDS=1 BENCH_REPLAY_RATE=1000 BENCH_FIRST_RATE=100 bench/compare.sh
	# Fuzz smoke: the api end to end for a few seconds (make fuzz: a million).
	go test -run '^$' -fuzz '^FuzzAPI$' -fuzztime 10s ./demo/payments
fi

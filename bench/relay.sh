#!/usr/bin/env bash
# Relay benchmarks beside their raw baselines, all in one run on durable
# local servers (Postgres with fsync on) under .data/bench:
#   1. redis-benchmark: pipelined EVALSHA of the apply script (the Redis limit)
#   2. pgbench: one-row INSERT transactions (the Postgres commit limit)
#   3. BenchmarkDrain: one relay, then two, draining a backlog of BENCH_EVENTS
#      (200k) into this Redis and into a Redis Cluster (TEST_REDIS_CLUSTER_URL,
#      else a private three-master one)
#   4. BenchmarkLag: commit→Redis lag at BENCH_RATE (1000) events/s
# Ports: BENCH_PG_PORT (45432), BENCH_REDIS_PORT (46379).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_port=${BENCH_PG_PORT:-45432}
redis_port=${BENCH_REDIS_PORT:-46379}
events=${BENCH_EVENTS:-200000}

scripts/services.sh start .data/bench "$pg_port" "$redis_port"
trap 'scripts/services.sh stop .data/bench' EXIT

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"

echo "== baseline: redis-benchmark, EVALSHA of lua/apply.lua, pipeline 500, 200-byte value"
sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$(cat lua/decode.lua lua/apply.lua)")
value="completed:1:c0123456789abcdef201$(head -c 200 /dev/zero | tr '\0' x)"
redis-cli -p "$redis_port" FLUSHALL >/dev/null
redis-benchmark -p "$redis_port" -q -n "$events" -P 500 -c 4 -r "$events" \
	EVALSHA "$sha" 1 "bench:__rand_int__" 1 "$value" 86400000 "" "" 2>&1 | tr '\r' '\n' | grep "requests per second"

echo "== baseline: pgbench, one-row INSERT per transaction, 8 clients, 10s"
PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qc "DROP TABLE IF EXISTS bench_insert; CREATE TABLE bench_insert (id bigserial PRIMARY KEY, v int)"
echo "INSERT INTO bench_insert (v) VALUES (1);" > .data/bench/insert.sql
pgbench -h 127.0.0.1 -p "$pg_port" -U postgres -n -c 8 -j 2 -T 10 -f .data/bench/insert.sql postgres | grep -E "^(tps|latency)"

echo "== relay: drain and lag"
export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
export TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
BENCH_EVENTS=$events go test -run '^$' -bench . -benchtime 1x -count "${BENCH_COUNT:-1}" ./relay

#!/usr/bin/env bash
# Relay benchmarks beside their raw baselines, all in one run on durable
# local servers (Postgres with fsync on) under BENCH_DIR (.data/bench):
#   1. redis-benchmark: pipelined EVALSHA of the apply script (the Redis limit)
#   2. pgbench: one-row INSERT transactions (the Postgres commit limit), and
#      a bare SELECT 1 paced at BENCH_RATE (1000) a second, whose latency
#      percentiles are the floor under the lag's tail on this machine
#   3. relay --once draining a backlog of BENCH_EVENTS (200k) events: the
#      rate, and the CPU each event cost the relay, Postgres and Redis (what
#      bounds the drain once batches overlap)
#   4. BenchmarkDrain: one relay, then two, draining BENCH_EVENTS into this
#      Redis and into a Redis Cluster (TEST_REDIS_CLUSTER_URL, else a private
#      three-master one)
#   5. BenchmarkLag: commit→Redis lag at BENCH_RATE events/s, the relay woken
#      by a NOTIFY after the commit (the engine's default) and in it
# Old beside new, in one run: BENCH_OLD_BIN (a relay binary) and
# BENCH_OLD_TEST (the relay package's test binary, `go test -c ./relay`),
# both built from an older commit, run steps 3 and 4-5 beside the new ones,
# alternating, BENCH_COUNT (1) times.
# Ports: BENCH_PG_PORT (61732), BENCH_REDIS_PORT (61779).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BENCH_DIR:-.data/bench}
pg_port=${BENCH_PG_PORT:-61732}
redis_port=${BENCH_REDIS_PORT:-61779}
events=${BENCH_EVENTS:-200000}
rate=${BENCH_RATE:-1000}
count=${BENCH_COUNT:-1}
old_bin=${BENCH_OLD_BIN:-}
old_test=${BENCH_OLD_TEST:-}

scripts/services.sh start "$dir" "$pg_port" "$redis_port"
trap 'scripts/services.sh stop "$dir"' EXIT
bin=$dir/bin # private: other benchmarks build into bin/
mkdir -p "$bin" && go build -o "$bin/" ./cmd/api ./cmd/relay
go test -c -o "$bin/relay.test" ./relay

psql_() { PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qtA "$@"; }

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"
echo "== new: $(git rev-parse --short HEAD) + working tree${old_bin:+; old relay: $old_bin}${old_test:+; old tests: $old_test}"

echo "== baseline: redis-benchmark, EVALSHA of lua/apply.lua, pipeline 500, 200-byte value"
sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$(cat lua/decode.lua lua/apply.lua)")
value="completed:1:c0123456789abcdef201$(head -c 200 /dev/zero | tr '\0' x)"
redis-cli -p "$redis_port" FLUSHALL >/dev/null
redis-benchmark -p "$redis_port" -q -n "$events" -P 500 -c 4 -r "$events" \
	EVALSHA "$sha" 1 "bench:__rand_int__" 1 "$value" 86400000 "" "" 2>&1 | tr '\r' '\n' | grep "requests per second"

echo "== baseline: pgbench, one-row INSERT per transaction, 8 clients, 10s"
psql_ -c "DROP TABLE IF EXISTS bench_insert" -c "CREATE TABLE bench_insert (id bigserial PRIMARY KEY, v int)"
echo "INSERT INTO bench_insert (v) VALUES (1);" >"$dir/insert.sql"
pgbench -h 127.0.0.1 -p "$pg_port" -U postgres -n -c 8 -j 2 -T 10 -f "$dir/insert.sql" postgres | grep -E "^(tps|latency)"

echo "== baseline: pgbench, SELECT 1 paced at $rate/s for 5s, one client: one Postgres round trip"
echo "SELECT 1;" >"$dir/select1.sql"
rm -f "$dir"/select1_log*
pgbench -h 127.0.0.1 -p "$pg_port" -U postgres -n -M prepared -c 1 -R "$rate" -T 5 -f "$dir/select1.sql" \
	--log --log-prefix="$dir/select1_log" postgres >/dev/null
cat "$dir"/select1_log* | awk '{ print $3 }' | sort -n | awk '{ a[NR] = $1 } END {
	printf "round trip p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms\n",
		a[int(NR * .5)] / 1000, a[int(NR * .99)] / 1000, a[int(NR * .999)] / 1000, a[NR] / 1000 }'
rm -f "$dir"/select1_log*

# CPU seconds used so far by Redis (INFO cpu) and by the Postgres server
# (the postmaster and its children, living and exited).
# shellcheck source=bench/cpu.sh
. bench/cpu.sh

# once NAME BIN: seed BENCH_EVENTS completed keys (200-byte bodies) with an
# event each, drain them with BIN --once, and print the rate and the CPU per
# event of the relay, Postgres and Redis.
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_relay?sslmode=disable"
export REDIS_URL="redis://127.0.0.1:$redis_port/0" LOG_LEVEL=warn
once() {
	psql_ -c "DROP DATABASE IF EXISTS bench_relay" -c "CREATE DATABASE bench_relay"
	"$bin/api" migrate up >/dev/null
	redis-cli -p "$redis_port" FLUSHALL >/dev/null
	psql_ -d bench_relay -c "INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
		SELECT 'bench', 'key-' || i, 'completed', 2, 'v1:' || md5(i::text), 201, convert_to(repeat('x', 200), 'UTF8'), now() + interval '1 day'
		FROM generate_series(1, $events) i" \
		-c "INSERT INTO outbox (scope, key, version) SELECT 'bench', 'key-' || i, 2 FROM generate_series(1, $events) i" \
		-c "VACUUM ANALYZE outbox" -c "VACUUM ANALYZE idempotency_keys" -c "CHECKPOINT"
	local r0 p0 out
	r0=$(redis_cpu "$redis_port") p0=$(pg_cpu "$dir") out=$(mktemp)
	/usr/bin/time -o "$out" -f "%e %U %S" "$2" --once --http-addr 127.0.0.1:0 >/dev/null
	sleep 0.5 # exited backends' CPU reaches the postmaster
	awk -v name="$1" -v n="$events" -v r="$(echo "$(redis_cpu "$redis_port") - $r0" | bc)" -v p="$(echo "$(pg_cpu "$dir") - $p0" | bc)" '{
		c = $2 + $3
		printf "%s: %d events/s; CPU µs per event: relay %.1f, postgres %.1f, redis %.1f, total %.1f\n",
			name, n / $1, c / n * 1e6, p / n * 1e6, r / n * 1e6, (c + p + r) / n * 1e6 }' "$out"
	rm -f "$out"
}
echo "== relay --once, $events events (200-byte bodies), batch ${RELAY_BATCH:-500}, in flight ${RELAY_IN_FLIGHT:-2}"
for _ in $(seq "$count"); do
	if [ -n "$old_bin" ]; then once old "$old_bin"; fi
	once new "$bin/relay"
done

echo "== relay benchmarks: drain and lag"
export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
export TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
export BENCH_EVENTS=$events BENCH_RATE=$rate
gobench() { # NAME BIN PATTERN
	local test
	test=$(realpath "$2")
	(cd relay && "$test" -test.run '^$' -test.bench "$3" -test.benchtime 1x) | grep -vE '^(PASS|ok |goarch|pkg)' | sed "s/^Benchmark/$1: Benchmark/"
}
for _ in $(seq "$count"); do
	for bench in '^BenchmarkDrain$' '^BenchmarkLag$'; do
		if [ -n "$old_test" ]; then gobench old "$old_test" "$bench"; fi
		gobench new "$bin/relay.test" "$bench"
	done
done

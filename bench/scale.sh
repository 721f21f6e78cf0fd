#!/usr/bin/env bash
# Scale-out figures (issue 7), one command, one run, on durable local servers
# under .data/bench: a single Redis (BENCH_REDIS_PORT, 61779) and a
# three-master Redis Cluster (BENCH_CLUSTER_PORT, 61780-61782), Postgres on
# BENCH_PG_PORT (61732).
#   1. relay drain: one relay vs two, into the single Redis and the cluster
#      (BenchmarkDrain, BENCH_EVENTS events, default 200k)
#   2. api throughput: one api process vs two, replays and first executions,
#      single Redis and cluster. The real api binary with a relay running;
#      wrk, BENCH_CONNS (32) connections in all, split evenly over the
#      processes, BENCH_SECONDS (10) per run, GOMAXPROCS=BENCH_API_PROCS
#      (all cores) per api. The apis listen on 29021-29022.
set -euo pipefail
cd "$(dirname "$0")/.."
pg_port=${BENCH_PG_PORT:-61732}
redis_port=${BENCH_REDIS_PORT:-61779}
cluster_port=${BENCH_CLUSTER_PORT:-61780}
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
events=${BENCH_EVENTS:-200000}
cluster_url="redis://127.0.0.1:$cluster_port?addr=127.0.0.1:$((cluster_port + 1))&addr=127.0.0.1:$((cluster_port + 2))"

command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; }
scripts/services.sh start .data/bench "$pg_port" "$redis_port"
scripts/services.sh cluster .data/bench "$cluster_port"
pids=()
stop_procs() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap 'stop_procs; scripts/services.sh stop .data/bench' EXIT
mkdir -p bin && go build -o bin/ ./cmd/api ./cmd/relay

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"

echo "== relay drain: $events events, one relay vs two"
TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable" \
	TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0" TEST_REDIS_CLUSTER_URL="$cluster_url" \
	BENCH_EVENTS=$events go test -run '^$' -bench Drain -benchtime 1x ./relay | grep events/s

# api_run LABEL SCRIPT N: N api processes under one load split over them;
# prints the summed req/s and the worst p99.
api_run() {
	local label=$1 script=$2 n=$3 i outs=() wrks=() total=0 p99=
	local per=$((conns / n))
	for i in $(seq "$n"); do
		outs+=("$(mktemp)")
		# BENCH_RUN=0 names the replayed key; unset, every run has new keys.
		BENCH_RUN=${BENCH_RUN:-$RANDOM$RANDOM$i} wrk -t1 -c"$per" -d"${secs}s" --latency -s "bench/wrk/$script" \
			"http://127.0.0.1:$((29020 + i))/v1/payments" >"${outs[-1]}" &
		wrks+=($!)
	done
	wait "${wrks[@]}"
	for f in "${outs[@]}"; do
		total=$(awk -v t="$total" '/Requests\/sec/ {printf "%.0f", t + $2}' "$f")
		p99="$p99 $(awk '$1 == "99%" {print $2}' "$f")"
		rm -f "$f"
	done
	printf '%-44s %8s req/s   p99 per process:%s\n' "$label" "$total" "$p99"
}

for target in single cluster; do
	db=bench_scale_$target
	PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
	export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/$db?sslmode=disable"
	unset REDIS_URL REDIS_CLUSTER_URL
	if [ "$target" = single ]; then
		export REDIS_URL="redis://127.0.0.1:$redis_port/0"
		redis-cli -p "$redis_port" FLUSHALL >/dev/null
	else
		export REDIS_CLUSTER_URL="$cluster_url"
		for p in "$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)); do redis-cli -p "$p" FLUSHALL >/dev/null; done
	fi
	bin/api migrate up >/dev/null
	HTTP_ADDR=127.0.0.1:29029 DATABASE_SESSION_URL="$DATABASE_URL" bin/relay 2>/dev/null &
	pids+=($!)
	for i in 1 2; do
		GOMAXPROCS=${BENCH_API_PROCS:-$(nproc)} HTTP_ADDR=127.0.0.1:$((29020 + i)) LOG_LEVEL=error bin/api 2>/dev/null &
		pids+=($!)
	done
	for i in 1 2; do
		for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$((29020 + i))/readyz" && break; sleep 0.1; done
		# The replayed key, stored once; bench/wrk/replay.lua sends the same request.
		curl -s -o /dev/null -X POST "http://127.0.0.1:$((29020 + i))/v1/payments" -H "Idempotency-Key: bench-replay-0" \
			-H 'Content-Type: application/json' -H 'Authorization: Bearer sk_test_demo' \
			-d '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}'
	done
	echo "== api on $target Redis ($conns connections in all, ${secs}s each)"
	BENCH_RUN=0 api_run "replays, 1 api process" replay.lua 1
	BENCH_RUN=0 api_run "replays, 2 api processes" replay.lua 2
	api_run "first executions, 1 api process" first.lua 1
	api_run "first executions, 2 api processes" first.lua 2
	stop_procs
done

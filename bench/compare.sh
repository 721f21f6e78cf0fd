#!/usr/bin/env bash
# The side-by-side benchmark of issue 6, one command, one run, same load
# generator (wrk, BENCH_CONNS connections, BENCH_SECONDS each) for all
# variants, on durable local servers under .data/bench:
#   (a) bare handler, one Redis GET        (b) bare handler, one INSERT
#   (c) Redis-only idempotency (Lua lock)  (d) Postgres-only idempotency
#   (e) onceonly, as configured by default (NOTIFY deferred) and with
#       DEFER_NOTIFY=false (NOTIFY in every transaction)
#   (f) onceonly with TwoPhase (the claim commits on its own, the default until one commit)
#   (g) onceonly with RedisNoAutoPipeline (each Redis command on its own
#       round trip, as the bare GET handler sends it)
#   (h) onceonly with NoClaimBatching (each claim in a statement of its own)
# and, for first executions, the SQL alone (bench/sqlceiling.sh: pgbench of
# the bare INSERT, the engine's default and SingleCommit statements, and the
# floors of any two-commit and any one-commit design; SQLCEILING_LADDER=1 adds
# the default statements on leaner schemas).
# A relay runs throughout, as it would in production. Replays for (a), (c), (d), (e); first executions for (b), (c), (d), (e);
# duplicate effects under retries and a FLUSHALL for (c), (d), (e); Redis
# memory per key. Ports: BENCH_PG_PORT (61732), BENCH_REDIS_PORT (61779), above
# the kernel's ephemeral range, where no outgoing connection can hold them; the
# variants listen on 29001-29009 (below the ephemeral range). BENCH_PROFILE=DIR
# saves CPU profiles of the onceonly runs there (go tool pprof -top FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_port=${BENCH_PG_PORT:-61732}
redis_port=${BENCH_REDIS_PORT:-61779}
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}

command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; }
scripts/services.sh start .data/bench "$pg_port" "$redis_port"
harness_pid= relay_pid=
cleanup() {
	[ -n "$harness_pid" ] && kill "$harness_pid" 2>/dev/null || true
	[ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	scripts/services.sh stop .data/bench
}
trap cleanup EXIT
mkdir -p bin && go build -o bin/ ./cmd/api ./cmd/relay ./bench/harness ./bench/openloop

PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qc "DROP DATABASE IF EXISTS bench_compare" -c "CREATE DATABASE bench_compare"
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_compare?sslmode=disable"
export REDIS_URL="redis://127.0.0.1:$redis_port/0"
bin/api migrate up >/dev/null
redis-cli -p "$redis_port" FLUSHALL >/dev/null

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"
echo "== Redis MEMORY USAGE (harness memory)"
bin/harness memory

DATABASE_SESSION_URL="$DATABASE_URL" bin/relay -http-addr 127.0.0.1:29011 2>/dev/null &
relay_pid=$!
bin/harness serve -base 29001 &
harness_pid=$!
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:29001/ && break; sleep 0.1; done

# ticks PID...: CPU time (user + system, with reaped children) of the
# processes, in clock ticks. cpu_now prints it for Postgres (the postmaster
# and its backends), the harness (Go: HTTP, engine, drivers), Redis and the
# relay, so each measure can say where a request's CPU went.
ticks() {
	local sum=0 pid t
	for pid in "$@"; do
		t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat" 2>/dev/null) # a backend may have ended
		sum=$((sum + ${t:-0}))
	done
	echo "$sum"
}
postmaster=$(head -1 .data/bench/pg/postmaster.pid)
redis_pid=$(pgrep -f "redis-server 127.0.0.1:$redis_port" | head -1)
cpu_now() {
	# The postmaster is read last: a backend that ends after pgrep listed it
	# is counted there (in its reaped children's time) if not in its own.
	# shellcheck disable=SC2046 # a list of pids
	echo "$(ticks $(pgrep -P "$postmaster") "$postmaster") $(ticks "$harness_pid") $(ticks "$redis_pid") $(ticks "$relay_pid")"
}
# cpu_per_request BEFORE AFTER REQUESTS: microseconds of CPU per request.
cpu_per_request() {
	awk -v b="$1" -v a="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		split(b, x, " "); split(a, y, " ")
		f = 1e6 / hz / (n > 0 ? n : 1)
		printf "cpu/req: pg %d us, go %d us, redis %d us, relay %d us", (y[1]-x[1])*f, (y[2]-x[2])*f, (y[3]-x[3])*f, (y[4]-x[4])*f }'
}

# measure NAME PORT SCRIPT [RUN]: one wrk run; prints req/s, p50, p99. RUN
# names the replayed key (0) or makes the new keys unique (default). The
# rate is kept in rate[PORT-SCRIPT] for the ratios at the end.
declare -A rate
measure() {
	local out prof=
	if [ -n "${BENCH_PROFILE:-}" ] && [ "$2" -ge 29005 ]; then
		mkdir -p "$BENCH_PROFILE"
		curl -s -o "$BENCH_PROFILE/$2-$3.pprof" "http://127.0.0.1:29010/debug/pprof/profile?seconds=$((secs - 1))" &
		prof=$!
	fi
	local before
	before=$(cpu_now)
	out=$(BENCH_RUN=${4:-$RANDOM$RANDOM} wrk -t2 -c"$conns" -d"${secs}s" --latency -s "bench/wrk/$3" "http://127.0.0.1:$2/v1/payments")
	rate[$2-$3]=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
	printf '%-34s %10s req/s   p50 %-9s p99 %-9s non-2xx %-6s %s\n' "$1" \
		"$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
		"$(echo "$out" | awk '$1 == "50%" {print $2}')" \
		"$(echo "$out" | awk '$1 == "99%" {print $2}')" \
		"$(echo "$out" | awk 'tolower($0) ~ /non-2xx/ {n = $NF} END {print n + 0}')" \
		"$(cpu_per_request "$before" "$(cpu_now)" "$(echo "$out" | awk '/requests in/ {print $1}')")"
	if [ -n "$prof" ]; then wait "$prof"; fi
}

echo "== replays (one stored key, answered again and again)"
# The stored key gets the same body and headers wrk sends (bench/wrk/replay.lua).
for port in 29003 29004 29005 29006 29008; do
	curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/payments" -H "Idempotency-Key: bench-replay-0" \
		-H 'Content-Type: application/json' -H 'Authorization: Bearer sk_test_demo' \
		-d '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}'
done
measure "(a) bare handler, one Redis GET" 29001 replay.lua 0
measure "(c) Redis-only idempotency" 29003 replay.lua 0
measure "(d) Postgres-only idempotency" 29004 replay.lua 0
measure "(e) onceonly" 29005 replay.lua 0
measure "(e) onceonly, NOTIFY in tx" 29006 replay.lua 0
measure "(g) onceonly, no auto-pipelining" 29008 replay.lua 0
echo "== first executions (a new key every request)"
measure "(b) bare handler, one INSERT" 29002 first.lua
measure "(c) Redis-only idempotency" 29003 first.lua
measure "(d) Postgres-only idempotency" 29004 first.lua
measure "(e) onceonly" 29005 first.lua
measure "(e) onceonly, NOTIFY in tx" 29006 first.lua
measure "(f) onceonly, TwoPhase" 29007 first.lua
measure "(g) onceonly, no auto-pipelining" 29008 first.lua
measure "(h) onceonly, no claim batching" 29009 first.lua
echo "== first executions, the SQL alone (pgbench of the engine's statements, no Go, no HTTP, no Redis: bench/sqlceiling.sh)"
sql_rates=$(bench/sqlceiling.sh 127.0.0.1 "$pg_port" bench_compare)
while read -r name tps; do
	rate[sql-$name]=$tps
	printf '%-34s %10s tps\n' "$name" "$tps"
done <<<"$sql_rates"

# Latency under a constant rate (open loop: measured from when each request
# was due, so queueing shows; wrk's closed loop above hides it).
# BENCH_REPLAY_RATE (5000) and BENCH_FIRST_RATE (500) requests per second.
replay_rate=${BENCH_REPLAY_RATE:-5000}
first_rate=${BENCH_FIRST_RATE:-500}
openloop() { bin/openloop -name "$1" -url "http://127.0.0.1:$2/v1/payments" -rate "$3" -key "$4" -run "$5" -duration "${secs}s"; }
echo "== latency at $replay_rate replays/s, open loop"
openloop "(a) bare handler, one Redis GET" 29001 "$replay_rate" fixed bench-replay
openloop "(e) onceonly" 29005 "$replay_rate" fixed bench-replay
openloop "(g) onceonly, no auto-pipelining" 29008 "$replay_rate" fixed bench-replay
echo "== latency at $first_rate first executions/s, open loop"
openloop "(b) bare handler, one INSERT" 29002 "$first_rate" unique "open-b-$RANDOM"
openloop "(e) onceonly" 29005 "$first_rate" unique "open-e-$RANDOM"
openloop "(f) onceonly, TwoPhase" 29007 "$first_rate" unique "open-f-$RANDOM"

echo "== duplicate effects: 300 requests x 4 copies (2 at once, 2 later), FLUSHALL halfway"
bin/harness dupes -n 300

# ratio A B: rate A over rate B, two decimals.
ratio() { awk -v a="${rate[$1]:-0}" -v b="${rate[$2]:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
echo "== ratios (targets of issue 16: replays >= 0.9x, first executions >= 0.35x)"
echo "replays, onceonly / bare Redis GET:                     $(ratio 29005-replay.lua 29001-replay.lua)"
echo "replays, onceonly no auto-pipelining / bare Redis GET: $(ratio 29008-replay.lua 29001-replay.lua)"
echo "replays, Redis-only pattern / bare Redis GET:           $(ratio 29003-replay.lua 29001-replay.lua)"
echo "first executions, onceonly / bare INSERT:               $(ratio 29005-first.lua 29002-first.lua)"
echo "first executions, onceonly NOTIFY in tx / bare INSERT:  $(ratio 29006-first.lua 29002-first.lua)"
echo "first executions, onceonly TwoPhase / bare INSERT:      $(ratio 29007-first.lua 29002-first.lua)"
echo "first executions, onceonly no auto-pipelining / bare:   $(ratio 29008-first.lua 29002-first.lua)"
echo "first executions, onceonly no claim batching / bare:    $(ratio 29009-first.lua 29002-first.lua)"
echo "first executions, Redis-only pattern / bare INSERT:     $(ratio 29003-first.lua 29002-first.lua)"
echo "first executions, SQL alone: default / bare INSERT:     $(ratio sql-default sql-bare)"
echo "first executions, SQL alone: SingleCommit / bare:       $(ratio sql-single sql-bare)"
if [ -n "${rate[sql-default_lean]:-}" ]; then
	echo "first executions, SQL alone: default, HOT completion: $(ratio sql-default_hot sql-bare)"
	echo "first executions, SQL alone: same, no CHECKs:         $(ratio sql-default_lean sql-bare)"
fi
echo "first executions, SQL alone: floor of two commits:      $(ratio sql-floor_2phase sql-bare)"
echo "first executions, SQL alone: floor of one commit:       $(ratio sql-floor_1commit sql-bare)"

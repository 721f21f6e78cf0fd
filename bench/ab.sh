#!/usr/bin/env bash
# bench/ab.sh OLD [NEW]: the engine as two commits build it, side by side on
# the same servers and the same load: the harness (bench/harness) of each
# serves its variants, and wrk measures both in alternating rounds (OLD,
# NEW, OLD, NEW, ...) so a noisy neighbour weighs on both alike. NEW is the
# work tree when left out. Variants: (d) Postgres only, (e) the default,
# (f) TwoPhase; replays of one stored key and first executions (a new
# key every request). Prints each round and, per variant, the median rate
# of each side and their ratio NEW/OLD.
#   BENCH_SECONDS (5) per measure, BENCH_ROUNDS (3), BENCH_CONNS (32),
#   BENCH_PG_PORT (61732), BENCH_REDIS_PORT (61779); the harnesses listen on
#   29001-29010 (OLD) and 29101-29110 (NEW).
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/ab.sh OLD [NEW]}
new=${2:-}
pg_port=${BENCH_PG_PORT:-61732}
redis_port=${BENCH_REDIS_PORT:-61779}
secs=${BENCH_SECONDS:-5}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNS:-32}

command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; }
work=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	scripts/services.sh stop .data/bench
	git worktree remove --force "$work/old" 2>/dev/null || true
	[ -d "$work/new" ] && git worktree remove --force "$work/new" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# build REF DIR: the harness, api and relay of REF (the work tree when
# empty) into DIR.
build() {
	local src=.
	if [ -n "$1" ]; then
		git worktree add -q --detach "$2" "$1"
		src=$2
	fi
	mkdir -p "$2/bin"
	(cd "$src" && go build -o "$2/bin/" ./bench/harness ./cmd/api ./cmd/relay)
}
build "$old" "$work/old"
build "$new" "$work/new"

scripts/services.sh start .data/bench "$pg_port" "$redis_port"
PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qc "DROP DATABASE IF EXISTS bench_ab" -c "CREATE DATABASE bench_ab"
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_ab?sslmode=disable"
export REDIS_URL="redis://127.0.0.1:$redis_port/0"
"$work/new/bin/api" migrate up >/dev/null
redis-cli -p "$redis_port" FLUSHALL >/dev/null

DATABASE_SESSION_URL="$DATABASE_URL" "$work/new/bin/relay" -http-addr 127.0.0.1:29011 2>/dev/null &
pids+=($!)
"$work/old/bin/harness" serve -base 29001 2>/dev/null &
pids+=($!)
"$work/new/bin/harness" serve -base 29101 2>/dev/null &
pids+=($!)
for port in 29001 29101; do
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done
for port in 29004 29005 29104 29105; do
	curl -s -o /dev/null -X POST "http://127.0.0.1:$port/v1/payments" -H "Idempotency-Key: bench-replay-0" \
		-H 'Content-Type: application/json' -H 'Authorization: Bearer sk_test_demo' \
		-d '{"amount":1000,"currency":"usd","customer":"cus_bench","source":"tok_visa"}'
done

echo "== $(nproc) cores; OLD $(git rev-parse --short "$old"), NEW ${new:-work tree}; ${secs}s per measure, $rounds rounds, $conns connections"
declare -A runs
# measure SIDE OFFSET SCRIPT RUN: one wrk run against the variant at
# OFFSET of SIDE's harness; the rate is appended to runs[OFFSET-SCRIPT-SIDE].
measure() {
	local base=29001 out r
	[ "$1" = new ] && base=29101
	out=$(BENCH_RUN=${4:-$RANDOM$RANDOM} wrk -t2 -c"$conns" -d"${secs}s" -s "bench/wrk/$3" "http://127.0.0.1:$((base + $2))/v1/payments")
	r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
	runs[$2-$3-$1]+="$r "
	printf '  %-4s %-12s +%d %10s req/s\n' "$1" "$3" "$2" "$r"
}
for round in $(seq "$rounds"); do
	echo "-- round $round"
	for variant in "3 replay.lua 0" "4 replay.lua 0" "3 first.lua" "4 first.lua" "6 first.lua"; do
		# shellcheck disable=SC2086 # the variant's words are its arguments
		measure old $variant
		# shellcheck disable=SC2086
		measure new $variant
	done
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "== medians (req/s) and NEW/OLD"
for key in "3-replay.lua:(d) Postgres only, replays" "4-replay.lua:(e) onceonly, replays" \
	"3-first.lua:(d) Postgres only, first executions" "4-first.lua:(e) onceonly, first executions" \
	"6-first.lua:(f) TwoPhase, first executions"; do
	k=${key%%:*}
	o=$(echo "${runs[$k-old]}" | median)
	n=$(echo "${runs[$k-new]}" | median)
	printf '%-40s OLD %10s  NEW %10s  NEW/OLD %s\n' "${key#*:}" "$o" "$n" "$(awk -v o="$o" -v n="$n" 'BEGIN {printf "%.2f", n / o}')"
done

#!/usr/bin/env bash
# onceonly on Citus beside plain PostgreSQL, same machine, one run, durable
# servers (fsync on) under BENCH_DIR (.data/bench-citus): a plain Postgres 15
# on BENCH_PG_PORT (61815), Redis on BENCH_REDIS_PORT (61816), and a Citus
# 13.2 cluster (scripts/citus.sh: coordinator on BENCH_CITUS_PORT, 61817,
# workers on the next two ports; Citus must be built: scripts/citus.sh
# build). On each:
#   1. relay drain: relay --once over a backlog of BENCH_EVENTS (100k)
#      completed keys with one event each, spread over BENCH_SCOPES (64)
#      scopes: events/s
#   2. first executions through the api (the real binary, a relay beside
#      it): wrk, BENCH_CONNS (32) connections, BENCH_SECONDS (10), every
#      request a new key, over BENCH_TENANTS (8) merchants
#      (bench/wrk/first.lua) and over one (all keys of one scope:
#      one shard on Citus), charging through the gateway process (its
#      charges on the plain Postgres, as a payment provider is elsewhere);
#      then over BENCH_TENANTS merchants with the api's in-process gateway,
#      whose charges share the api's database (on Citus a reference table:
#      every charge written on every node): req/s and p99
# then the ratios Citus / plain. BENCH_STEPS ("relay first") picks the
# steps; BENCH_COUNT (1) repeats the pairs, alternating. All servers share
# the machine's cores: on Citus three Postgres servers do the work one does
# on plain Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BENCH_DIR:-.data/bench-citus}
pg_port=${BENCH_PG_PORT:-61815}
redis_port=${BENCH_REDIS_PORT:-61816}
citus_port=${BENCH_CITUS_PORT:-61817}
events=${BENCH_EVENTS:-100000}
scopes=${BENCH_SCOPES:-64}
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
tenants=${BENCH_TENANTS:-8}
count=${BENCH_COUNT:-1}
steps=${BENCH_STEPS:-relay first}
api_addr=127.0.0.1:29031
gateway_addr=127.0.0.1:29038

command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; }
scripts/services.sh start "$dir" "$pg_port" "$redis_port"
scripts/citus.sh start "$dir/citus" "$citus_port"
pids=()
stop_procs() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap 'stop_procs; scripts/citus.sh stop "$dir/citus"; scripts/services.sh stop "$dir"' EXIT
bin=$dir/bin
mkdir -p "$bin" && go build -o "$bin/" ./cmd/api ./cmd/relay ./cmd/gateway

echo "== machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(psql -h 127.0.0.1 -p "$citus_port" -U postgres -tAc 'SELECT citus_version()' | cut -d' ' -f1-2), $(go version | cut -d' ' -f3)"
echo "== $(git rev-parse --short HEAD) + working tree"

psql_() { PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -U postgres -qtA "$@"; }

# fresh TARGET: an empty database bench_citus on TARGET (plain or citus),
# migrated; prints its URL.
fresh() {
	if [ "$1" = plain ]; then
		psql_ -p "$pg_port" -c "DROP DATABASE IF EXISTS bench_citus WITH (FORCE)" -c "CREATE DATABASE bench_citus"
		echo "postgres://postgres@127.0.0.1:$pg_port/bench_citus?sslmode=disable"
	else
		scripts/citus.sh dropdb "$dir/citus" "$citus_port" bench_citus
		scripts/citus.sh createdb "$dir/citus" "$citus_port" bench_citus
	fi
}

# port_of URL
port_of() { sed -E 's#.*@[^:]+:([0-9]+)/.*#\1#' <<<"$1"; }

# drain TARGET: seeds the backlog and times relay --once over it.
drain() {
	local url port out
	url=$(fresh "$1")
	port=$(port_of "$url")
	DATABASE_URL=$url "$bin/api" migrate up >/dev/null
	redis-cli -p "$redis_port" FLUSHALL >/dev/null
	psql_ -p "$port" -d bench_citus -c "INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
		SELECT 'bench-' || (i % $scopes), 'key-' || i, 'completed', 2, 'v1:' || md5(i::text), 201, convert_to(repeat('x', 200), 'UTF8'), now() + interval '1 day'
		FROM generate_series(1, $events) i" \
		-c "INSERT INTO outbox (scope, key, version) SELECT 'bench-' || (i % $scopes), 'key-' || i, 2 FROM generate_series(1, $events) i" \
		-c "VACUUM ANALYZE outbox" -c "VACUUM ANALYZE idempotency_keys"
	out=$(mktemp)
	if ! DATABASE_URL=$url REDIS_URL="redis://127.0.0.1:$redis_port/0" LOG_LEVEL=warn \
		/usr/bin/time -o "$out" -f "%e" "$bin/relay" --once --http-addr 127.0.0.1:0 >/dev/null 2>"$out.err"; then
		echo "$1 relay --once failed: $(tail -1 "$out.err")" >&2
		rm -f "$out" "$out.err"
		return
	fi
	rm -f "$out.err"
	awk -v name="$1" -v n="$events" '{ printf "%-6s relay --once: %6d events/s (%d events, %.1f s)\n", name, n / $1, n, $1 }' "$out"
	rm -f "$out"
}

# first TARGET TENANTS GATEWAY: first executions through one api on
# TARGET; GATEWAY "external" (the gateway process, its charges on the plain
# Postgres, as a real payment provider is elsewhere) or "in-process" (the
# api's own, its charges in TARGET's database: on Citus a reference table).
first() {
	local url keys="" i out gw=()
	url=$(fresh "$1")
	DATABASE_URL=$url "$bin/api" migrate up >/dev/null
	redis-cli -p "$redis_port" FLUSHALL >/dev/null
	for i in $(seq 0 $(($2 - 1))); do keys="$keys${keys:+,}sk_bench$i=acct_bench$i"; done
	[ "$3" = external ] && gw=(GATEWAY_URL="http://$gateway_addr")
	export DATABASE_URL=$url REDIS_URL="redis://127.0.0.1:$redis_port/0" LOG_LEVEL=error
	HTTP_ADDR=127.0.0.1:29039 DATABASE_SESSION_URL="$url" "$bin/relay" 2>/dev/null &
	pids+=($!)
	env HTTP_ADDR=$api_addr API_KEYS="$keys" "${gw[@]}" "$bin/api" 2>/dev/null &
	pids+=($!)
	for _ in $(seq 100); do "$bin/api" probe "http://$api_addr/readyz" 2>/dev/null && break; sleep 0.1; done
	out=$(mktemp)
	BENCH_RUN=$RANDOM$RANDOM BENCH_TENANTS=$2 wrk -t2 -c"$conns" -d"${secs}s" --latency -s bench/wrk/first.lua \
		"http://$api_addr/v1/payments" >"$out"
	stop_procs
	unset DATABASE_URL REDIS_URL LOG_LEVEL
	awk -v name="$1" -v t="$2" -v g="$3" '/Requests\/sec/ { r = $2 } $1 == "99%" { p = $2 } /^non-2xx/ { e = $2 }
		END { printf "%-6s first executions, %d merchant(s), %s gateway: %7.0f req/s, p99 %s, non-2xx %d\n", name, t, g, r, p, e }' "$out"
	rm -f "$out"
}

# The external gateway: a process of its own for the whole run, its charges
# in database bench_gateway of the plain Postgres.
psql_ -p "$pg_port" -c "DROP DATABASE IF EXISTS bench_gateway WITH (FORCE)" -c "CREATE DATABASE bench_gateway"
HTTP_ADDR=$gateway_addr DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_gateway?sslmode=disable" LOG_LEVEL=error \
	"$bin/gateway" 2>/dev/null &
gateway_pid=$!
trap 'stop_procs; kill $gateway_pid 2>/dev/null; scripts/citus.sh stop "$dir/citus"; scripts/services.sh stop "$dir"' EXIT
for _ in $(seq 100); do "$bin/api" probe "http://$gateway_addr/readyz" 2>/dev/null && break; sleep 0.1; done

results=$(mktemp)
for _ in $(seq "$count"); do
	if [[ " $steps " == *" relay "* ]]; then
		echo "== relay drain: $events events over $scopes scopes"
		for target in plain citus; do drain "$target" | tee -a "$results"; done
	fi
	[[ " $steps " == *" first "* ]] || continue
	for run in "$tenants external" "1 external" "$tenants in-process"; do
		read -r n gateway <<<"$run"
		echo "== first executions: wrk -c$conns ${secs}s, $n merchant(s), $gateway gateway"
		for target in plain citus; do first "$target" "$n" "$gateway" | tee -a "$results"; done
	done
done
echo "== Citus / plain (means over $count run(s))"
awk '
	/relay --once/ { k = "relay drain"; v = $4 }
	/first executions/ { k = "first executions, " $4 " merchant(s), " $6 " gateway"; v = $8 }
	{ if ($1 == "plain") { p[k] += v } else { c[k] += v }; keys[k] = 1 }
	END { for (k in keys) if (p[k] > 0 && c[k] > 0) printf "%-50s %.2fx\n", k, c[k] / p[k] }' "$results"
rm -f "$results"

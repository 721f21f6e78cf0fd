#!/usr/bin/env bash
# Reconciler pass over BENCH_SIZES keys (default "100000 1000000"), each beside
# a bare SCAN of the same Redis keyspace, on durable local servers under
# BENCH_DIR (.data/bench). For each size: seed Postgres, fill Redis with a
# first (repairing) pass, then time BENCH_REPEAT (2) steady passes (everything
# in sync) and read their peak RSS with GNU time. With BENCH_OLD_BIN set to
# another reconciler binary (one built from an older commit), every steady
# pass of bin/reconciler is run beside one of it on the same data, so the two
# are compared in one run. BENCH_REDIS=cluster runs it on a three-master
# Redis Cluster (BENCH_CLUSTER_PORT, 61780-61782) instead of a single Redis.
# Ports: BENCH_PG_PORT (61732), BENCH_REDIS_PORT (61779).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BENCH_DIR:-.data/bench}
pg_port=${BENCH_PG_PORT:-61732}
redis_port=${BENCH_REDIS_PORT:-61779}
sizes=${BENCH_SIZES:-100000 1000000}
repeat=${BENCH_REPEAT:-2}
old_bin=${BENCH_OLD_BIN:-}
cluster_port=${BENCH_CLUSTER_PORT:-61780}
redis_ports=("$redis_port")

scripts/services.sh start "$dir" "$pg_port" "$redis_port"
trap 'scripts/services.sh stop "$dir"' EXIT
mkdir -p bin && go build -o bin/ ./cmd/... ./bench/scan

psql_() { PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qtA "$@"; }
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_reconcile?sslmode=disable"
export LOG_LEVEL=warn
if [ "${BENCH_REDIS:-single}" = cluster ]; then
	scripts/services.sh cluster "$dir" "$cluster_port"
	redis_ports=("$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)))
	export REDIS_CLUSTER_URL="redis://127.0.0.1:$cluster_port?addr=127.0.0.1:$((cluster_port + 1))&addr=127.0.0.1:$((cluster_port + 2))"
	scan_args=(-redis-cluster-url "$REDIS_CLUSTER_URL")
else
	export REDIS_URL="redis://127.0.0.1:$redis_port/0"
	scan_args=(-redis-url "$REDIS_URL")
fi

# CPU seconds used so far by the servers (bench/cpu.sh).
# shellcheck source=bench/cpu.sh
. bench/cpu.sh

# steady NAME BIN [WHAT]: one pass of BIN: its report, peak RSS and the CPU
# seconds it, Redis and Postgres used, on one line.
steady() {
	local r0 p0 out
	echo -n "${3:-steady pass (in sync)}, $1: "
	r0=$(redis_cpu "${redis_ports[@]}") p0=$(pg_cpu "$dir") out=$(mktemp)
	/usr/bin/time -o "$out" -f "%M %U %S" "$2" --once | tr -d '\n'
	sleep 0.5 # exited backends' CPU reaches the postmaster
	awk -v r="$(echo "$(redis_cpu "${redis_ports[@]}") - $r0" | bc)" -v p="$(echo "$(pg_cpu "$dir") - $p0" | bc)" \
		'{ printf " peak_rss_kb=%d cpu_s: reconciler=%.2f redis=%.2f postgres=%.2f\n", $1, $2 + $3, r, p }' "$out"
	rm -f "$out"
}

echo "== Redis: ${BENCH_REDIS:-single}; machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"
echo "== shared_buffers $(psql_ -c 'SHOW shared_buffers'); new: bin/reconciler ($(git rev-parse --short HEAD) + working tree)${old_bin:+; old: $old_bin}"
for n in $sizes; do
	psql_ -c "DROP DATABASE IF EXISTS bench_reconcile" -c "CREATE DATABASE bench_reconcile"
	bin/api migrate up >/dev/null
	for p in "${redis_ports[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
	psql_ -d bench_reconcile -c "INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
		SELECT 'acct_' || (i % 100), 'key-' || i, 'completed', 2, 'v1:' || md5(i::text), 201,
		       convert_to(repeat('x', 200), 'UTF8'), now() + interval '1 day'
		FROM generate_series(1, $n) i" -c "VACUUM ANALYZE idempotency_keys"
	echo "== $n keys (table $(psql_ -d bench_reconcile -c "SELECT pg_size_pretty(pg_table_size('idempotency_keys'))"), primary key $(psql_ -d bench_reconcile -c "SELECT pg_size_pretty(pg_relation_size('idempotency_keys_pkey'))"))"
	echo -n "first pass (all missing, repairs): "
	bin/reconciler --once | tr -d '\n'; echo
	for i in $(seq "$repeat"); do
		echo -n "baseline, bare SCAN MATCH idem:* COUNT 1000 (bench/scan): "
		bin/scan "${scan_args[@]}"
		if [ -n "$old_bin" ]; then steady old "$old_bin"; fi
		steady new bin/reconciler
	done
	for bin in ${old_bin:+old} new; do
		for i in $(seq 1000); do
			echo "SET idem:acct_$((i % 100)):ghost-$i completed:2:x EX 3600"
			echo "DEL idem:acct_$((i % 100)):key-$i"
		done | redis-cli -c -p "${redis_ports[0]}" >/dev/null
		if [ "$bin" = old ]; then
			steady old "$old_bin" "drift pass (1,000 orphans, 1,000 missing)"
		else
			steady new bin/reconciler "drift pass (1,000 orphans, 1,000 missing)"
		fi
	done
done

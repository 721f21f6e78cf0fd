#!/usr/bin/env bash
# Reconciler pass over BENCH_SIZES keys (default "100000 1000000"), each beside
# a bare SCAN of the same Redis keyspace, on durable local servers under
# .data/bench. For each size: seed Postgres, fill Redis with a first
# (repairing) pass, then time a steady pass (everything in sync) and read its
# peak RSS with GNU time. BENCH_REDIS=cluster runs it on a three-master
# Redis Cluster (BENCH_CLUSTER_PORT, 47380-47382) instead of a single Redis.
# Ports: BENCH_PG_PORT (45432), BENCH_REDIS_PORT (46379).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_port=${BENCH_PG_PORT:-45432}
redis_port=${BENCH_REDIS_PORT:-46379}
sizes=${BENCH_SIZES:-100000 1000000}
cluster_port=${BENCH_CLUSTER_PORT:-47380}
redis_ports=("$redis_port")

scripts/services.sh start .data/bench "$pg_port" "$redis_port"
trap 'scripts/services.sh stop .data/bench' EXIT
mkdir -p bin && go build -o bin/ ./cmd/... ./bench/scan

psql_() { PGOPTIONS=-cclient_min_messages=warning psql -h 127.0.0.1 -p "$pg_port" -U postgres -qtA "$@"; }
export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/bench_reconcile?sslmode=disable"
export LOG_LEVEL=warn
if [ "${BENCH_REDIS:-single}" = cluster ]; then
	scripts/services.sh cluster .data/bench "$cluster_port"
	redis_ports=("$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)))
	export REDIS_CLUSTER_URL="redis://127.0.0.1:$cluster_port?addr=127.0.0.1:$((cluster_port + 1))&addr=127.0.0.1:$((cluster_port + 2))"
	scan_args=(-redis-cluster-url "$REDIS_CLUSTER_URL")
else
	export REDIS_URL="redis://127.0.0.1:$redis_port/0"
	scan_args=(-redis-url "$REDIS_URL")
fi

echo "== Redis: ${BENCH_REDIS:-single}; machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(psql --version), $(go version | cut -d' ' -f3)"
for n in $sizes; do
	psql_ -c "DROP DATABASE IF EXISTS bench_reconcile" -c "CREATE DATABASE bench_reconcile"
	bin/api migrate up >/dev/null
	for p in "${redis_ports[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
	psql_ -d bench_reconcile -c "INSERT INTO idempotency_keys (scope, key, status, version, fingerprint, response_status, response_body, expires_at)
		SELECT 'acct_' || (i % 100), 'key-' || i, 'completed', 2, 'v1:' || md5(i::text), 201,
		       convert_to(repeat('x', 200), 'UTF8'), now() + interval '1 day'
		FROM generate_series(1, $n) i" -c "VACUUM ANALYZE idempotency_keys"
	echo "== $n keys"
	echo -n "first pass (all missing, repairs): "
	bin/reconciler --once | tr -d '\n'; echo
	echo -n "baseline, bare SCAN MATCH idem:* COUNT 1000 (bench/scan): "
	bin/scan "${scan_args[@]}"
	echo -n "steady pass (in sync): "
	/usr/bin/time -f " peak_rss_kb=%M" bin/reconciler --once 2>&1 | tr -d '\n'; echo
done

#!/usr/bin/env bash
# Runs the whole system on this machine: local Postgres and Redis (installed
# and started as needed, data under .data/dev), migrations, then the api on
# HTTP_ADDR (:8080) with the relay, the reconciler, the demo's payment
# gateway and the demo's message consumer beside it; the api and the
# consumer charge through the gateway (GATEWAY_URL).
# Logs are interleaved on stderr, each line labelled. Ctrl-C stops everything.
#
# The consumer reads payment messages from NATS JetStream (nats-server,
# the Debian package, installed when missing and started under .data/dev) or,
# with BROKER=rabbitmq, from RabbitMQ (rabbitmq-server, likewise). With
# BROKER=kafka or BROKER=sqs it reads them from a stand-in broker built from
# this workspace and started under .data/dev: franz-go's kfake for Kafka,
# goaws behind a JSON front for SQS (neither is the real service:
# docs/running.md says what they leave untested). With BROKER_URL set, it
# consumes there and starts no broker. RUN_DATA (.data/dev) moves the
# servers' and the brokers' data elsewhere.
#
# With DATABASE_URL and REDIS_URL (or REDIS_CLUSTER_URL) set, it uses those
# servers and starts none. REDIS_CLUSTER=1 runs everything on a local
# three-master Redis Cluster (REDIS_CLUSTER_PORT, 7000-7002) instead of the
# single Redis.
# Ports: PG_PORT (5432), REDIS_PORT (6379), NATS_PORT (4222), AMQP_PORT
# (5672; RabbitMQ's Erlang ports are the next seven), KAFKA_PORT (9092),
# SQS_PORT (9324; goaws itself takes a free port behind it), HTTP_ADDR (:8080),
# RELAY_HTTP_ADDR (:8081), RECONCILER_HTTP_ADDR (:8082),
# GATEWAY_HTTP_ADDR (:8083), CONSUMER_HTTP_ADDR (:8084).
#
# scripts/run.sh stop (make stop), from another terminal, stops a run going:
# it signals the run as Ctrl-C does and waits for it; after a run that was
# killed outright, it ends the daemons and the servers that run left. The
# run's pids are kept in RUN_STATE ($RUN_DATA/run).
set -euo pipefail
cd "$(dirname "$0")/.."

data=${RUN_DATA:-.data/dev}
state=${RUN_STATE:-$data/run}

# alive PID: PID is a process still running.
alive() { kill -0 "$1" 2>/dev/null; }

# stop_run: stops the run recorded in $state, or what a run killed outright
# left of it.
stop_run() {
	if [ ! -d "$state" ]; then
		echo "run: nothing to stop (no $state: no make run going)" >&2
		return 0
	fi
	local pid
	# The data directory of the run, whatever RUN_DATA says here.
	data=$(cat "$state/data" 2>/dev/null || echo "$data")
	pid=$(cat "$state/pid" 2>/dev/null || true)
	if [ -n "$pid" ] && alive "$pid"; then
		kill -TERM "$pid"
		# The run stops its daemons (each within 10 s) and its servers, then
		# removes $state.
		for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
	fi
	[ -d "$state" ] || { echo "run: stopped" >&2; return 0; }
	# The run is gone and left its daemons: end them as it would have.
	local pids=()
	[ -f "$state/daemons" ] && mapfile -t pids <"$state/daemons"
	for pid in "${pids[@]}"; do alive "$pid" && kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do
		for _ in $(seq 150); do alive "$pid" || break; sleep 0.1; done
		alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
	done
	case "$(cat "$state/servers" 2>/dev/null || true)" in
	all) scripts/services.sh stop "$data" ;;
	brokers) scripts/services.sh stop-brokers "$data" ;;
	esac
	rm -rf "$state"
	echo "run: stopped what a run left" >&2
}

case "${1:-}" in
stop) stop_run; exit 0 ;;
"") ;;
*) echo "usage: $0 [stop]" >&2; exit 2 ;;
esac
if [ -f "$state/pid" ] && alive "$(cat "$state/pid")"; then
	echo "run: a run is going already (pid $(cat "$state/pid")): make stop first" >&2
	exit 1
fi
rm -rf "$state"
mkdir -p "$state"
echo $$ >"$state/pid"
echo "$data" >"$state/data"

started=
if [ -z "${DATABASE_URL:-}" ] || [ -z "${REDIS_URL:-}${REDIS_CLUSTER_URL:-}" ]; then
	pg_port=${PG_PORT:-5432}
	redis_port=${REDIS_PORT:-6379}
	echo all >"$state/servers"
	scripts/services.sh start "$data" "$pg_port" "$redis_port"
	started=1
	psql -h 127.0.0.1 -p "$pg_port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'onceonly'" | grep -q 1 ||
		psql -h 127.0.0.1 -p "$pg_port" -U postgres -qc "CREATE DATABASE onceonly"
	export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/onceonly?sslmode=disable"
	export REDIS_URL="redis://127.0.0.1:$redis_port/0"
	if [ -n "${REDIS_CLUSTER:-}" ]; then
		p=${REDIS_CLUSTER_PORT:-7000}
		scripts/services.sh cluster "$data" "$p"
		unset REDIS_URL
		export REDIS_CLUSTER_URL="redis://127.0.0.1:$p?addr=127.0.0.1:$((p + 1))&addr=127.0.0.1:$((p + 2))"
	fi
fi
export LOG_FORMAT=${LOG_FORMAT:-text}

broker=${BROKER:-nats}
case "$broker" in
nats | rabbitmq | kafka | sqs) ;;
*) echo "run: BROKER=$broker: say nats, rabbitmq, kafka or sqs" >&2; exit 2 ;;
esac
broker_started=
if [ -z "${BROKER_URL:-}" ]; then
	[ -n "$started" ] || echo brokers >"$state/servers"
	case "$broker" in
	rabbitmq)
		p=${AMQP_PORT:-5672}
		scripts/services.sh rabbitmq "$data" "$p"
		BROKER_URL="amqp://guest:guest@127.0.0.1:$p/"
		;;
	kafka)
		p=${KAFKA_PORT:-9092}
		scripts/services.sh kafka "$data" "$p"
		BROKER_URL="kafka://127.0.0.1:$p"
		;;
	sqs)
		p=${SQS_PORT:-9324}
		scripts/services.sh sqs "$data" "$p"
		BROKER_URL="sqs://127.0.0.1:$p"
		;;
	*)
		p=${NATS_PORT:-4222}
		scripts/services.sh nats "$data" "$p"
		BROKER_URL="nats://127.0.0.1:$p"
		;;
	esac
	broker_started=1
fi
export BROKER_URL

mkdir -p bin
go build -o bin/ ./cmd/...
bin/api migrate up

pids=()
stop_all() {
	trap - INT TERM EXIT
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait || true
	if [ -n "$started" ]; then
		scripts/services.sh stop "$data"
	elif [ -n "$broker_started" ]; then
		scripts/services.sh stop-brokers "$data"
	fi
	rm -rf "$state"
}
trap stop_all INT TERM EXIT

label() { sed -u "s/^/[$1] /" >&2; }
start() {
	local name=$1
	shift
	"$@" > >(label "$name") 2>&1 &
	pids+=($!)
	echo $! >>"$state/daemons"
}
# Each daemon serves its ops endpoints on its own port. The gateway comes
# first: the api charges through it.
gateway_addr=${GATEWAY_HTTP_ADDR:-:8083}
start gateway env HTTP_ADDR="$gateway_addr" bin/gateway
for _ in $(seq 1 50); do
	bin/api probe "http://127.0.0.1:${gateway_addr##*:}/readyz" 2>/dev/null && break
	sleep 0.2
done
start api env HTTP_ADDR="${HTTP_ADDR:-:8080}" GATEWAY_URL="${GATEWAY_URL:-http://127.0.0.1:${gateway_addr##*:}}" bin/api
[ -x bin/relay ] && start relay env HTTP_ADDR="${RELAY_HTTP_ADDR:-:8081}" DATABASE_SESSION_URL="${DATABASE_SESSION_URL:-$DATABASE_URL}" bin/relay
[ -x bin/reconciler ] && start reconciler env HTTP_ADDR="${RECONCILER_HTTP_ADDR:-:8082}" bin/reconciler
# The consumer runs the engine's resumer only: the relay and the reconciler
# above serve it too.
start consumer env HTTP_ADDR="${CONSUMER_HTTP_ADDR:-:8084}" GATEWAY_URL="${GATEWAY_URL:-http://127.0.0.1:${gateway_addr##*:}}" bin/consumer
echo "onceonly: api on ${HTTP_ADDR:-:8080}, consumer on $broker ($BROKER_URL) (Ctrl-C stops everything)" >&2
wait -n || true

#!/usr/bin/env bash
# Local Postgres 15 and Redis for onceonly, without Docker.
#
#   scripts/services.sh install            install missing Debian packages
#   scripts/services.sh start DIR PG_PORT REDIS_PORT [test]
#   scripts/services.sh cluster DIR FIRST_PORT [test]
#   scripts/services.sh stop DIR
#
# Data lives under DIR (git-ignored .data/ by default) and is reused by the
# next start. As root, initdb and postgres run as the "postgres" user. With
# "test", durability is traded for speed (fsync off, no Redis persistence).
# "cluster" starts a three-master Redis Cluster on FIRST_PORT..FIRST_PORT+2
# (REDIS_CLUSTER_URL=redis://127.0.0.1:FIRST_PORT?addr=...).
set -euo pipefail

log() { echo "services: $*" >&2; }

as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bin() {
	local d
	for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] && { echo "$d"; return; }
	done
	command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return; }
	return 1
}

install() {
	local missing=()
	pg_bin >/dev/null 2>&1 || missing+=(postgresql postgresql-contrib)
	command -v redis-server >/dev/null || missing+=(redis-server)
	command -v redis-cli >/dev/null || missing+=(redis-tools)
	[ ${#missing[@]} -eq 0 ] && return
	if [ "$(id -u)" != 0 ]; then
		log "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
		exit 1
	fi
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	# The Debian package starts a system redis on 6379; the project runs its own.
	if command -v service >/dev/null; then service redis-server stop >/dev/null 2>&1 || true; fi
	pkill -x redis-server >/dev/null 2>&1 || true
}

start() {
	local dir=$1 pg_port=$2 redis_port=$3 mode=${4:-}
	install
	local bin
	bin=$(pg_bin)
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	chmod 755 "$dir"
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
		mkdir -p "$dir/pg"
		chown postgres "$dir/pg"
		# postgres must be able to reach the data folder.
		local p=$dir
		while [ "$p" != / ]; do chmod o+x "$p" 2>/dev/null || true; p=$(dirname "$p"); done
	fi
	if [ ! -f "$dir/pg/PG_VERSION" ]; then
		log "initdb in $dir/pg"
		as_pg "$bin/initdb" -D "$dir/pg" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
	fi
	local opts="-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories=$dir/pg -c max_connections=400"
	if [ "$mode" = test ]; then
		opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	fi
	if ! as_pg "$bin/pg_ctl" -D "$dir/pg" status >/dev/null 2>&1; then
		as_pg "$bin/pg_ctl" -D "$dir/pg" -l "$dir/pg/server.log" -o "$opts" -w -t 60 start >/dev/null
		log "postgres on 127.0.0.1:$pg_port"
	fi
	if ! redis_up "$redis_port"; then
		local persist=(--save "" --appendonly no)
		[ "$mode" = test ] || persist=(--save 60 1 --appendonly no)
		redis-server --port "$redis_port" --bind 127.0.0.1 --daemonize yes \
			--dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "${persist[@]}"
		log "redis on 127.0.0.1:$redis_port"
	fi
	wait_redis "$redis_port"
}

# redis_up: something answers on the port (PONG, or LOADING while a saved
# dataset loads); redis_ready: it answers PONG.
redis_up() { redis-cli -p "$1" ping >/dev/null 2>&1; }
redis_ready() { [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; }

# wait_redis PORT: until it answers PONG; loading a large saved dataset can
# take a while.
wait_redis() {
	for _ in $(seq 600); do redis_ready "$1" && return; sleep 0.1; done
	log "redis on port $1 is not ready after 60s"
	exit 1
}

cluster_ok() {
	local port
	for port in "$@"; do
		redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
		redis-cli -p "$port" cluster info 2>/dev/null | grep -q "^cluster_known_nodes:$#" || return 1
	done
}

cluster() {
	local dir=$1 first=$2 mode=${3:-}
	install
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	local ports=("$first" $((first + 1)) $((first + 2))) port bus node
	local persist=(--save "" --appendonly no)
	[ "$mode" = test ] || persist=(--save 60 1 --appendonly no)
	for port in "${ports[@]}"; do
		redis_up "$port" && continue
		node=$dir/cluster-$port
		mkdir -p "$node"
		# The bus port defaults to port+10000, which must exist; past 65535
		# take one above the kernel's ephemeral range (32768-60999), where no
		# outgoing connection can hold it when the node binds.
		bus=$((port + 10000))
		[ "$bus" -le 65535 ] || bus=$((61000 + port % 4535))
		# A port can be held for a moment by another process's outgoing
		# connection (both ports lie in the ephemeral range): try again.
		for _ in 1 2 3; do
			redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$node" \
				--pidfile "$node/redis.pid" --logfile "$node/redis.log" "${persist[@]}" \
				--cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" \
				--cluster-node-timeout 2000 --cluster-require-full-coverage no
			for _ in $(seq 20); do redis_up "$port" && break 2; sleep 0.1; done
			grep -q "Address already in use" "$node/redis.log" || break
			log "port $port or $bus was busy; starting the node again"
			sleep 0.5
		done
	done
	for port in "${ports[@]}"; do wait_redis "$port"; done
	for _ in $(seq 30); do cluster_ok "${ports[@]}" && break; sleep 0.1; done
	if ! cluster_ok "${ports[@]}"; then
		# New nodes, or nodes whose saved cluster state no longer fits: start over.
		log "creating the Redis Cluster on ports ${ports[*]}"
		for port in "${ports[@]}"; do
			redis-cli -p "$port" flushall >/dev/null
			redis-cli -p "$port" cluster reset hard >/dev/null
		done
		redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
		for _ in $(seq 100); do cluster_ok "${ports[@]}" && break; sleep 0.1; done
		cluster_ok "${ports[@]}" || { log "the Redis Cluster did not become ready"; exit 1; }
	fi
	log "redis cluster on 127.0.0.1:${ports[0]}-${ports[2]}"
}

stop() {
	local dir=$1 bin pid
	bin=$(pg_bin)
	for pid in "$dir"/cluster-*/redis.pid; do
		[ -f "$pid" ] || continue
		kill "$(cat "$pid")" 2>/dev/null || true
		rm -f "$pid"
	done
	if [ -f "$dir/pg/PG_VERSION" ]; then
		as_pg "$bin/pg_ctl" -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
	fi
	if [ -f "$dir/redis.pid" ]; then
		kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
		rm -f "$dir/redis.pid"
	fi
}

cmd=${1:-}
shift || true
case "$cmd" in
install) install ;;
start) start "$@" ;;
cluster) cluster "$@" ;;
stop) stop "$@" ;;
*) echo "usage: $0 install | start DIR PG_PORT REDIS_PORT [test] | cluster DIR FIRST_PORT [test] | stop DIR" >&2; exit 2 ;;
esac

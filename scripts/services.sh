#!/usr/bin/env bash
# Local Postgres 15 and Redis for onceonly, without Docker.
#
#   scripts/services.sh install            install missing Debian packages
#   scripts/services.sh tools              install Chromium and promtool when missing
#   scripts/services.sh start DIR PG_PORT REDIS_PORT [test]
#   scripts/services.sh redis DIR REDIS_PORT [test]   Redis alone
#   scripts/services.sh cluster DIR FIRST_PORT [test]
#   scripts/services.sh pgbouncer DIR PG_PORT BOUNCER_PORT [PG_HOST]
#   scripts/services.sh sentinel DIR FIRST_PORT [test]
#   scripts/services.sh rabbitmq DIR PORT
#   scripts/services.sh nats DIR PORT
#   scripts/services.sh install-nats       install nats-server when missing
#   scripts/services.sh kafka DIR PORT     a stand-in Kafka (kfake)
#   scripts/services.sh sqs DIR PORT       a stand-in SQS (goaws)
#   scripts/services.sh stop DIR
#   scripts/services.sh stop-brokers DIR   the brokers only
#
# Data lives under DIR (git-ignored .data/ by default) and is reused by the
# next start. As root, initdb and postgres run as the "postgres" user. With
# "test", durability is traded for speed (fsync off, no Redis persistence).
# "cluster" starts a three-master Redis Cluster on FIRST_PORT..FIRST_PORT+2
# (REDIS_CLUSTER_URL=redis://127.0.0.1:FIRST_PORT?addr=...).
# "pgbouncer" starts PgBouncer (Debian package, installed when missing) in
# transaction pooling mode on BOUNCER_PORT in front of the Postgres on
# PG_HOST:PG_PORT (127.0.0.1 by default), every database passed through as
# user postgres without a password.
# "sentinel" starts a Redis primary on FIRST_PORT, its replica on FIRST_PORT+1
# and three Sentinels on FIRST_PORT+2..FIRST_PORT+4 watching them as master
# "onceonly" (REDIS_SENTINEL_URL=redis://127.0.0.1:FIRST_PORT+2?master_name=
# onceonly&addr=127.0.0.1:FIRST_PORT+3&addr=127.0.0.1:FIRST_PORT+4).
# "rabbitmq" starts a RabbitMQ node of its own (Debian rabbitmq-server,
# installed when missing; the system service the package starts is stopped)
# with its data, logs, configuration and Erlang cookie in DIR/rabbitmq:
# AMQP on 127.0.0.1:PORT (amqp://guest:guest@127.0.0.1:PORT/; RabbitMQ lets
# guest in from loopback only), Erlang distribution on PORT+1, an epmd of its
# own on PORT+2 and the CLI tools' distribution on PORT+3..PORT+7, so it
# never meets another node on the machine. It returns once the node answers
# an AMQP handshake. DIR/rabbitmq/rabbitmqctl runs rabbitmqctl against it.
# "nats" starts nats-server (Debian package, installed when missing) with
# JetStream on, on 127.0.0.1:PORT (TEST_NATS_URL=nats://127.0.0.1:PORT), its
# streams stored in DIR/nats.
# "kafka" starts a stand-in Kafka broker: franz-go's kfake, one process
# (oncekafka/internal/kfakeserver, built from this workspace with the go
# command into DIR/kafka), on 127.0.0.1:PORT (kafka://127.0.0.1:PORT), its
# records and committed offsets kept in DIR/kafka/data across restarts.
# "sqs" starts a stand-in SQS: goaws behind the JSON front the SDK speaks
# (oncesqs/internal/goawsd, built likewise into DIR/sqs), the endpoint on
# 127.0.0.1:PORT (sqs://127.0.0.1:PORT); goaws keeps its queues in memory
# only, so a restart empties them. Neither is Kafka or SQS: see
# docs/running.md.
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
	apt_install "${missing[@]}"
	# The Debian package starts a system redis on 6379; the project runs its own.
	service_stop redis-server
	pkill -x redis-server >/dev/null 2>&1 || true
}

# apt_install PACKAGE...: installs missing Debian packages, as root (or
# exits saying how).
apt_install() {
	if [ "$(id -u)" != 0 ]; then
		log "missing $*: install them (apt-get install $*) or run as root"
		exit 1
	fi
	log "installing $*"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# service_stop NAME: stops the system service a package just installed may
# have started on its default port: the project runs its own.
service_stop() {
	if command -v service >/dev/null; then service "$1" stop >/dev/null 2>&1 || true; fi
}

# await TRIES CMD...: runs CMD every 0.1s until it succeeds (status 0), at
# most TRIES times (status 1).
await() {
	local tries=$1 _
	shift
	for _ in $(seq "$tries"); do
		"$@" && return 0
		sleep 0.1
	done
	return 1
}

# tools: what the tests use besides servers: Debian's Chromium (the
# console's browser test) and promtool from Debian's prometheus package (the
# alert rules' tests). Without recommends: no node exporter, no desktop.
tools() {
	local missing=()
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
	command -v promtool >/dev/null || missing+=(prometheus)
	[ ${#missing[@]} -eq 0 ] && return
	if [ "$(id -u)" != 0 ]; then
		log "missing ${missing[*]}: install them (apt-get install --no-install-recommends ${missing[*]}) or run as root"
		exit 1
	fi
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# The Debian package starts a system Prometheus; the tests need only promtool.
	if command -v service >/dev/null; then service prometheus stop >/dev/null 2>&1 || true; fi
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
	redis "$dir" "$redis_port" "$mode"
}

# redis DIR PORT [test]: a Redis server on PORT with its files in DIR
# (started by start, or alone).
redis() {
	local dir=$1 redis_port=$2 mode=${3:-}
	install
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
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
	await 600 redis_ready "$1" && return
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

# pgbouncer DIR PG_PORT BOUNCER_PORT [PG_HOST]: PgBouncer in transaction
# mode, as an operator runs it in front of Postgres; its files live in
# DIR/pgbouncer.
# port_open PORT: something accepts connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pgbouncer() {
	local dir=$1 pg_port=$2 port=$3 pg_host=${4:-127.0.0.1}
	# type -P: the binary on PATH, not this script's function of that name.
	if ! type -P pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
		apt_install pgbouncer
		# The package may start a system PgBouncer on 6432; the project runs its own.
		service_stop pgbouncer
	fi
	local bin
	bin=$(type -P pgbouncer || echo /usr/sbin/pgbouncer)
	mkdir -p "$dir/pgbouncer"
	dir=$(cd "$dir" && pwd)/pgbouncer
	if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; then
		return
	fi
	if [ "$(id -u)" = 0 ]; then
		# PgBouncer refuses to run as root: it runs as "postgres", which must
		# reach its folder.
		chown postgres "$dir"
		local p=$dir
		while [ "$p" != / ]; do chmod o+x "$p" 2>/dev/null || true; p=$(dirname "$p"); done
	fi
	echo '"postgres" ""' >"$dir/userlist.txt"
	cat >"$dir/pgbouncer.ini" <<-INI
		[databases]
		* = host=$pg_host port=$pg_port user=postgres
		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $port
		unix_socket_dir =
		auth_type = trust
		auth_file = $dir/userlist.txt
		pool_mode = transaction
		max_client_conn = 900
		default_pool_size = 40
		ignore_startup_parameters = extra_float_digits
		pidfile = $dir/pgbouncer.pid
		logfile = $dir/pgbouncer.log
	INI
	local _ attempt
	for attempt in 1 2 3 4 5; do
		as_pg "$bin" -d "$dir/pgbouncer.ini"
		if await 50 port_open "$port"; then
			log "pgbouncer (transaction mode) on 127.0.0.1:$port"
			return
		fi
		# A port in the ephemeral range may be held for a moment by an
		# outgoing connection: try again.
		log "pgbouncer did not start on port $port (attempt $attempt): $(tail -1 "$dir/pgbouncer.log" 2>/dev/null)"
		sleep 1
	done
	log "pgbouncer did not start on port $port: see $dir/pgbouncer.log"
	exit 1
}

# sentinel_ok SENTINEL_PORT...: the master the Sentinels name has a replica
# in sync, and every Sentinel knows the other Sentinels and the replica.
sentinel_ok() {
	local master port
	master=$(redis-cli -p "$1" sentinel get-master-addr-by-name onceonly 2>/dev/null | tail -n 1)
	[ -n "$master" ] || return 1
	redis-cli -p "$master" info replication 2>/dev/null | grep -q '^slave0:.*state=online' || return 1
	for port in "$@"; do
		[ "$(redis-cli -p "$port" sentinel sentinels onceonly 2>/dev/null | grep -c '^name$')" = $(($# - 1)) ] || return 1
		[ "$(redis-cli -p "$port" sentinel replicas onceonly 2>/dev/null | grep -c '^name$')" = 1 ] || return 1
	done
}

# sentinel DIR FIRST_PORT [test]: see the top. Each Sentinel gets a fresh
# configuration on every start (a Sentinel rewrites its own); the servers
# keep their roles across restarts (the replica is started as one).
sentinel() {
	local dir=$1 first=$2 mode=${3:-}
	install
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	local primary=$first replica=$((first + 1)) port node
	local sentinels=($((first + 2)) $((first + 3)) $((first + 4)))
	local persist=(--save "" --appendonly no)
	[ "$mode" = test ] || persist=(--save 60 1 --appendonly no)
	for port in "$primary" "$replica"; do
		redis_up "$port" && continue
		node=$dir/sentinel-$port
		mkdir -p "$node"
		local role=()
		[ "$port" = "$replica" ] && role=(--replicaof 127.0.0.1 "$primary")
		redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$node" \
			--pidfile "$node/redis.pid" --logfile "$node/redis.log" "${persist[@]}" \
			--repl-diskless-sync-delay 0 "${role[@]}"
	done
	for port in "$primary" "$replica"; do wait_redis "$port"; done
	# The Debian package redis-sentinel is redis-server under another name.
	local bin=(redis-server) flag=(--sentinel)
	command -v redis-sentinel >/dev/null && { bin=(redis-sentinel); flag=(); }
	for port in "${sentinels[@]}"; do
		redis_up "$port" && continue
		node=$dir/sentinel-$port
		mkdir -p "$node"
		cat >"$node/sentinel.conf" <<-CONF
			port $port
			bind 127.0.0.1
			daemonize yes
			dir $node
			pidfile $node/sentinel.pid
			logfile $node/sentinel.log
			sentinel monitor onceonly 127.0.0.1 $primary 2
			sentinel down-after-milliseconds onceonly 5000
			sentinel failover-timeout onceonly 30000
		CONF
		"${bin[@]}" "$node/sentinel.conf" "${flag[@]}"
	done
	for port in "${sentinels[@]}"; do wait_redis "$port"; done
	for _ in $(seq 300); do sentinel_ok "${sentinels[@]}" && break; sleep 0.1; done
	sentinel_ok "${sentinels[@]}" || { log "the Sentinel group on ports $first-$((first + 4)) did not become ready"; exit 1; }
	log "redis sentinel: primary 127.0.0.1:$primary, replica :$replica, sentinels :${sentinels[0]}-${sentinels[2]} (master onceonly)"
}

# rabbitmq_ready PORT: a broker answers the AMQP 0-9-1 protocol header
# with a method frame (type 1, connection.start) on 127.0.0.1:PORT.
rabbitmq_ready() {
	local first
	first=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "AMQP\x00\x00\x09\x01" >&3 && head -c 1 <&3 | od -An -tx1' _ "$1" 2>/dev/null) || return 1
	[ "${first// /}" = 01 ]
}

# rabbitmq_started PORT PIDFILE: the node is ready, or its process is gone.
rabbitmq_started() { rabbitmq_ready "$1" || ! kill -0 "$(cat "$2")" 2>/dev/null; }

# rabbitmq DIR PORT: see the top. The node's files live in DIR/rabbitmq and
# are reused by the next start on the same PORT (the node is named after it).
rabbitmq() {
	local dir=$1 port=$2
	local sbin=/usr/lib/rabbitmq/bin
	if [ ! -x "$sbin/rabbitmq-server" ]; then
		apt_install rabbitmq-server
		# The package may start a system node on 5672 (with epmd on 4369);
		# the project runs its own.
		service_stop rabbitmq-server
	fi
	mkdir -p "$dir/rabbitmq"
	dir=$(cd "$dir/rabbitmq" && pwd)
	if [ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null && rabbitmq_ready "$port"; then
		return
	fi
	# Sourced by rabbitmq-server and by every CLI tool run through the
	# wrapper below: they find the node by its name, its epmd port and the
	# cookie in $HOME.
	cat >"$dir/rabbitmq-env.conf" <<-ENV
		export RABBITMQ_NODENAME=onceonly-$port@localhost
		export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
		export RABBITMQ_NODE_PORT=$port
		export RABBITMQ_DIST_PORT=$((port + 1))
		export ERL_EPMD_PORT=$((port + 2))
		export RABBITMQ_CTL_DIST_PORT_MIN=$((port + 3))
		export RABBITMQ_CTL_DIST_PORT_MAX=$((port + 7))
		export RABBITMQ_MNESIA_BASE=$dir/mnesia
		export RABBITMQ_LOG_BASE=$dir/log
		export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
		export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
		export RABBITMQ_PID_FILE=$dir/beam.pid
		# No busy-waiting schedulers: the node shares the machine with the tests.
		export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}"
	ENV
	cat >"$dir/rabbitmq.conf" <<-CONF
		listeners.tcp.1 = 127.0.0.1:$port
		log.console = false
		log.file.level = warning
	CONF
	echo '[].' >"$dir/enabled_plugins"
	cat >"$dir/rabbitmqctl" <<-CTL
		#!/bin/sh
		# rabbitmqctl against the node on port $port (scripts/services.sh rabbitmq).
		HOME=$dir RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf exec $sbin/rabbitmqctl "\$@"
	CTL
	chmod +x "$dir/rabbitmqctl"
	# An epmd of its own, on a port of its own: the node would otherwise
	# start one on 4369, shared with every Erlang node of the machine.
	if ! { [ -f "$dir/epmd.pid" ] && kill -0 "$(cat "$dir/epmd.pid")" 2>/dev/null; }; then
		ERL_EPMD_ADDRESS=127.0.0.1 setsid epmd -port $((port + 2)) </dev/null >>"$dir/epmd.log" 2>&1 &
		echo $! >"$dir/epmd.pid"
	fi
	HOME=$dir RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf setsid "$sbin/rabbitmq-server" </dev/null >"$dir/server.log" 2>&1 &
	echo $! >"$dir/server.pid"
	# Ready, or the node is gone (no use waiting on).
	await 600 rabbitmq_started "$port" "$dir/server.pid"
	if rabbitmq_ready "$port"; then
		log "rabbitmq on 127.0.0.1:$port (distribution :$((port + 1)), epmd :$((port + 2)))"
		return
	fi
	log "rabbitmq did not start on port $port: see $dir/server.log and $dir/log"
	tail -5 "$dir/server.log" >&2 || true
	exit 1
}

# rabbitmq_stop DIR: the node's wrapper stops it gracefully on TERM (its
# queues are on disk); a node that does not stop in 30s is killed.
rabbitmq_stop() {
	local dir=$1/rabbitmq pid
	if [ -f "$dir/server.pid" ]; then
		pid=$(cat "$dir/server.pid")
		if kill -TERM "$pid" 2>/dev/null; then
			for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		fi
		[ -f "$dir/beam.pid" ] && kill -KILL "$(cat "$dir/beam.pid")" 2>/dev/null || true
		rm -f "$dir/server.pid" "$dir/beam.pid"
	fi
	if [ -f "$dir/epmd.pid" ]; then
		kill "$(cat "$dir/epmd.pid")" 2>/dev/null || true
		rm -f "$dir/epmd.pid"
	fi
}

# nats_ready PORT: the server on PORT greets with an INFO line that says
# JetStream is on (it accepts clients only once JetStream is up).
nats_ready() {
	local line
	line=$(exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$1" && IFS= read -r -t 2 l <&3 && printf '%s' "$l") || return 1
	[[ $line == INFO* && $line == *'"jetstream":true'* ]]
}

# install_nats: nats-server (the Debian package) when missing, for tests
# that start servers of their own.
install_nats() {
	if ! type -P nats-server >/dev/null; then
		apt_install nats-server
		# The package may start a system nats-server on 4222; the project runs its own.
		service_stop nats-server
	fi
}

# nats DIR PORT: see the top. The server runs in the background, its pid
# and log in DIR/nats.
nats() {
	local dir=$1 port=$2
	install_nats
	mkdir -p "$dir/nats"
	dir=$(cd "$dir" && pwd)/nats
	nats_ready "$port" && return
	nohup nats-server --jetstream --store_dir "$dir" --addr 127.0.0.1 --port "$port" \
		--pid "$dir/nats.pid" --log "$dir/nats.log" >/dev/null 2>&1 &
	if await 300 nats_ready "$port"; then
		log "nats-server (JetStream) on 127.0.0.1:$port"
		return
	fi
	log "nats-server did not start on port $port: see $dir/nats.log"
	exit 1
}

# standin_build DIR NAME PACKAGE: builds PACKAGE of this workspace into
# DIR/NAME (go build is quick once its cache is warm).
standin_build() {
	local dir=$1 name=$2 pkg=$3
	mkdir -p "$dir"
	(cd "$(dirname "$0")/.." && go build -o "$dir/$name" "$pkg") || {
		log "could not build $pkg (it needs the go command and this workspace)"
		exit 1
	}
}

# standin_start DIR NAME PORT ARGS...: starts DIR/NAME ARGS... in the
# background (pid in DIR/NAME.pid, output in DIR/NAME.log) unless it runs
# already, and waits until 127.0.0.1:PORT accepts connections.
standin_start() {
	local dir=$1 name=$2 port=$3
	shift 3
	if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null && port_open "$port"; then
		return
	fi
	nohup "$dir/$name" "$@" </dev/null >"$dir/$name.log" 2>&1 &
	echo $! >"$dir/$name.pid"
	if await 300 port_open "$port"; then
		return
	fi
	log "$name did not start on port $port: see $dir/$name.log"
	tail -5 "$dir/$name.log" >&2 || true
	exit 1
}

# kafka DIR PORT: see the top.
kafka() {
	local dir=$1 port=$2
	mkdir -p "$dir/kafka/data"
	dir=$(cd "$dir/kafka" && pwd)
	standin_build "$dir" kfakeserver github.com/onceonly/onceonly/oncekafka/internal/kfakeserver
	standin_start "$dir" kfakeserver "$port" -port "$port" -data-dir "$dir/data"
	log "kfake (a stand-in Kafka) on 127.0.0.1:$port"
}

# sqs DIR PORT: see the top.
sqs() {
	local dir=$1 port=$2
	mkdir -p "$dir/sqs"
	dir=$(cd "$dir/sqs" && pwd)
	standin_build "$dir" goawsd github.com/onceonly/onceonly/oncesqs/internal/goawsd
	standin_start "$dir" goawsd "$port" -addr 127.0.0.1:0 -front "127.0.0.1:$port"
	log "goaws (a stand-in SQS) on 127.0.0.1:$port"
}

# standin_stop DIR NAME: ends DIR/NAME (TERM: kfake flushes its data) and
# waits for it; one still going after 10 s is killed.
standin_stop() {
	local pidfile=$1/$2.pid pid
	[ -f "$pidfile" ] || return 0
	pid=$(cat "$pidfile")
	if kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

# stop_brokers DIR: every broker of DIR.
stop_brokers() {
	local dir=$1
	rabbitmq_stop "$dir"
	stop_nats "$dir"
	standin_stop "$dir/kafka" kfakeserver
	standin_stop "$dir/sqs" goawsd
}

stop() {
	local dir=$1 bin pid
	stop_brokers "$dir"
	bin=$(pg_bin)
	if [ -f "$dir/pgbouncer/pgbouncer.pid" ]; then
		kill "$(cat "$dir/pgbouncer/pgbouncer.pid")" 2>/dev/null || true
	fi
	for pid in "$dir"/cluster-*/redis.pid "$dir"/sentinel-*/*.pid; do
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

# stop_nats DIR: ends the nats-server of DIR and waits for it, so the next
# start finds its store unlocked.
stop_nats() {
	local pidfile=$1/nats/nats.pid pid
	[ -f "$pidfile" ] || return 0
	pid=$(cat "$pidfile")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	rm -f "$pidfile"
}

cmd=${1:-}
shift || true
case "$cmd" in
install) install ;;
tools) tools ;;
start) start "$@" ;;
redis) redis "$@" ;;
install-nats) install_nats ;;
cluster) cluster "$@" ;;
pgbouncer) pgbouncer "$@" ;;
sentinel) sentinel "$@" ;;
rabbitmq) rabbitmq "$@" ;;
nats) nats "$@" ;;
kafka) kafka "$@" ;;
sqs) sqs "$@" ;;
stop) stop "$@" ;;
stop-brokers) stop_brokers "$@" ;;
*) echo "usage: $0 install | tools | start DIR PG_PORT REDIS_PORT [test] | redis DIR REDIS_PORT [test] | install-nats | cluster DIR FIRST_PORT [test] | pgbouncer DIR PG_PORT BOUNCER_PORT [PG_HOST] | sentinel DIR FIRST_PORT [test] | rabbitmq DIR PORT | nats DIR PORT | kafka DIR PORT | sqs DIR PORT | stop DIR | stop-brokers DIR" >&2; exit 2 ;;
esac

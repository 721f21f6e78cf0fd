#!/usr/bin/env bash
# Citus 13.2 (distributed PostgreSQL) on this machine's PostgreSQL 15, for
# onceonly past one Postgres primary (docs/citus.md) and `make test-citus`.
#
#   scripts/citus.sh build                    build Citus from CITUS_SRC, install it
#   scripts/citus.sh start DIR PORT           coordinator on PORT, workers on PORT+1, PORT+2
#   scripts/citus.sh createdb DIR PORT NAME   database NAME on every node, workers registered
#   scripts/citus.sh dropdb DIR PORT NAME     drops NAME on every node
#   scripts/citus.sh stop DIR
#
# "build" compiles the Citus source tree CITUS_SRC (a checkout of tag
# v13.2.2: git clone --branch v13.2.2 https://github.com/citusdata/citus)
# against the installed PostgreSQL 15 (PG_CONFIG, default
# /usr/lib/postgresql/15/bin/pg_config) in a copy of it (CITUS_BUILD,
# default .data/citus-build), then installs it into PostgreSQL's lib and
# extension folders, as root. It installs the build dependencies (Debian
# packages; the server headers at exactly the server's version) and does
# nothing when Citus 13.2 is installed already. The copy gets the one fix
# Debian's PostgreSQL 15 headers need from 15.20 on (see fix_build_tree);
# CITUS_SRC is left as it is.
#
# "start" creates (once) and starts three PostgreSQL servers under DIR, each
# with Citus preloaded: the coordinator on 127.0.0.1:PORT and two workers on
# PORT+1 and PORT+2, durable (fsync on), trusting local connections as user
# postgres, then registers the workers with the coordinator in database
# postgres: postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
# As root, the servers run as the "postgres" user. Citus registers nodes
# per database: "createdb" makes a database with the extension on every
# node and the workers registered in it, as `api migrate up` needs.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "citus: $*" >&2; }

as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_config_bin() {
	local c=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
	[ -x "$c" ] || { log "no pg_config at $c: install PostgreSQL 15 (scripts/services.sh install) or set PG_CONFIG"; exit 1; }
	echo "$c"
}

# installed: Citus 13.2 is installed for this PostgreSQL.
installed() {
	local c
	c=$(pg_config_bin)
	[ -f "$("$c" --pkglibdir)/citus.so" ] &&
		grep -q "^default_version = '13\.2-" "$("$c" --sharedir)/extension/citus.control" 2>/dev/null
}

# apt_missing PACKAGE...: installs the Debian packages among PACKAGE (name
# or name=version) that are not installed at that version, as root.
apt_missing() {
	local want=() p name version have
	for p in "$@"; do
		name=${p%%=*} version=
		[ "$name" != "$p" ] && version=${p#*=}
		have=$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)
		if [[ $have == "install ok installed"* ]] && { [ -z "$version" ] || [ "${have##* }" = "$version" ]; }; then
			continue
		fi
		want+=("$p")
	done
	[ ${#want[@]} -eq 0 ] && return
	if [ "$(id -u)" != 0 ]; then
		log "missing ${want[*]}: install them (apt-get install ${want[*]}) or run as root"
		exit 1
	fi
	log "installing ${want[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null
}

# build_deps: the compiler and libraries Citus's configure asks for, and the
# server headers of exactly the installed server (a minor version's headers
# can differ).
build_deps() {
	command -v dpkg-query >/dev/null || {
		log "not a Debian system: install PostgreSQL 15's server headers, libcurl, lz4, zstd, flex and bison yourself"
		return
	}
	local server
	server=$(dpkg-query -W -f='${Version}' postgresql-15 2>/dev/null || true)
	[ -n "$server" ] || { log "PostgreSQL 15 is not installed (scripts/services.sh install)"; exit 1; }
	apt_missing "postgresql-server-dev-15=$server" build-essential autoconf flex bison \
		libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev libselinux1-dev \
		libxslt1-dev libpam0g-dev libreadline-dev libssl-dev
}

# fix_build_tree DIR: Debian's PostgreSQL 15 headers from 15.20 on (the
# security update apt-get installs unless told the server's version) declare
# have_createdb_privilege() in commands/dbcommands.h, which Citus 13.2
# defines again, static, in pg_version_compat.h for PostgreSQL 15 ("static
# declaration of 'have_createdb_privilege' follows non-static declaration").
# When the headers declare it, Citus's static copy and its one caller are
# renamed in the build tree: the renamed copy works against any 15.x server
# (calling the server's would leave citus.so an undefined symbol on a 15.18
# server). 15.18's own headers need nothing.
fix_build_tree() {
	local tree=$1 pgc include
	pgc=$(pg_config_bin)
	include=$("$pgc" --includedir-server)
	[[ $("$pgc" --version) == "PostgreSQL 15."* ]] || return 0
	if grep -qw have_createdb_privilege "$include/commands/dbcommands.h"; then
		log "the server headers declare have_createdb_privilege: renaming Citus's static copy"
		sed -i 's/\bhave_createdb_privilege\b/citus_have_createdb_privilege/g' \
			"$tree/src/include/pg_version_compat.h" "$tree/src/backend/distributed/commands/serialize_distributed_ddls.c"
	fi
}

build() {
	if installed; then
		log "Citus 13.2 is installed for $("$(pg_config_bin)" --version)"
		return
	fi
	local src=${CITUS_SRC:-}
	if [ -z "$src" ] || [ ! -f "$src/configure" ]; then
		log "set CITUS_SRC to a Citus 13.2 source tree, e.g.:"
		log "  git clone --depth 1 --branch v13.2.2 https://github.com/citusdata/citus /tmp/citus"
		log "  CITUS_SRC=/tmp/citus scripts/citus.sh build"
		exit 1
	fi
	grep -q 'AC_INIT(\[Citus\], \[13\.2\.' "$src/configure.ac" || { log "$src is not Citus 13.2 (configure.ac)"; exit 1; }
	build_deps
	local tree=${CITUS_BUILD:-$root/.data/citus-build} pgc
	pgc=$(pg_config_bin)
	rm -rf "$tree"
	mkdir -p "$tree"
	cp -a "$src/." "$tree/"
	tree=$(cd "$tree" && pwd)
	fix_build_tree "$tree"
	log "building Citus in $tree against $("$pgc" --version)"
	(cd "$tree" && ./configure PG_CONFIG="$pgc" >configure.log 2>&1) || { tail -20 "$tree/configure.log" >&2; exit 1; }
	make -C "$tree" -j"$(nproc)" -s >"$tree/make.log" 2>&1 || { grep -m 20 -B2 -A2 'error' "$tree/make.log" >&2; exit 1; }
	if [ "$(id -u)" != 0 ]; then
		log "built; install it as root: sudo make -C $tree install"
		exit 1
	fi
	make -C "$tree" -s install >>"$tree/make.log" 2>&1 || { tail -20 "$tree/make.log" >&2; exit 1; }
	installed || { log "make install did not install Citus 13.2 into $("$pgc" --pkglibdir)"; exit 1; }
	log "installed Citus $(sed -n 's/^AC_INIT(\[Citus\], \[\(.*\)\])/\1/p' "$tree/configure.ac") into $("$pgc" --pkglibdir)"
}

# psql_at PORT DB SQL: runs SQL on the node at 127.0.0.1:PORT, unaligned,
# tuples only, stopping at the first error.
psql_at() {
	PGOPTIONS=-cclient_min_messages=warning psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d "$2" -tAc "$3"
}

# register PORT DB: the coordinator on PORT knows itself and its workers
# (PORT+1, PORT+2) in DB.
register() {
	local port=$1 db=$2 w
	psql_at "$port" "$db" "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
	psql_at "$port" "$db" "SELECT citus_set_coordinator_host('127.0.0.1', $port)" >/dev/null
	for w in $((port + 1)) $((port + 2)); do
		psql_at "$w" "$db" "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
		if [ "$(psql_at "$port" "$db" "SELECT count(*) FROM pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = $w")" = 0 ]; then
			psql_at "$port" "$db" "SELECT citus_add_node('127.0.0.1', $w)" >/dev/null
		fi
	done
}

start() {
	local dir=$1 port=$2
	if ! installed; then
		log "Citus 13.2 is not installed for PostgreSQL 15: CITUS_SRC=/path/to/citus scripts/citus.sh build (see docs/citus.md)"
		exit 1
	fi
	local bin node p i n
	bin=$(dirname "$(pg_config_bin)")
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
		# postgres must be able to reach the data folders.
		p=$dir
		while [ "$p" != / ]; do chmod o+x "$p" 2>/dev/null || true; p=$(dirname "$p"); done
	fi
	for i in 0 1 2; do
		n=$((port + i))
		node=$dir/node-$n
		mkdir -p "$node"
		[ "$(id -u)" = 0 ] && chown postgres "$node"
		if [ ! -f "$node/PG_VERSION" ]; then
			log "initdb in $node"
			as_pg "$bin/initdb" -D "$node" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
			echo "include_if_exists = 'citus.conf'" | as_pg tee -a "$node/postgresql.conf" >/dev/null
		fi
		# Rewritten at every start: the port is the one given.
		as_pg tee "$node/citus.conf" >/dev/null <<-CONF
			listen_addresses = '127.0.0.1'
			port = $n
			unix_socket_directories = '$node'
			shared_preload_libraries = 'citus'
			max_connections = 500
			fsync = on
			synchronous_commit = on
			wal_level = logical
			citus.enable_statistics_collection = off
		CONF
		if ! as_pg "$bin/pg_ctl" -D "$node" status >/dev/null 2>&1; then
			as_pg "$bin/pg_ctl" -D "$node" -l "$node/server.log" -w -t 60 start >/dev/null ||
				{ tail -5 "$node/server.log" >&2; exit 1; }
		fi
	done
	register "$port" postgres
	log "coordinator on 127.0.0.1:$port, workers on :$((port + 1)) and :$((port + 2)) (postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable)"
}

createdb() {
	local port=$2 name=$3 n
	[[ $name =~ ^[a-z_][a-z0-9_]*$ ]] || { log "database name $name: use lowercase letters, digits and _"; exit 2; }
	for n in "$port" $((port + 1)) $((port + 2)); do
		if [ "$(psql_at "$n" postgres "SELECT count(*) FROM pg_database WHERE datname = '$name'")" = 0 ]; then
			psql_at "$n" postgres "CREATE DATABASE $name" >/dev/null
		fi
	done
	register "$port" "$name"
	echo "postgres://postgres@127.0.0.1:$port/$name?sslmode=disable"
}

dropdb() {
	local port=$2 name=$3 n
	for n in "$port" $((port + 1)) $((port + 2)); do
		psql_at "$n" postgres "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" >/dev/null
	done
}

stop() {
	local dir=$1 bin node
	bin=$(dirname "$(pg_config_bin)")
	for node in "$dir"/node-*; do
		[ -f "$node/PG_VERSION" ] || continue
		as_pg "$bin/pg_ctl" -D "$node" -m fast -w stop >/dev/null 2>&1 || true
	done
}

cmd=${1:-}
shift || true
case "$cmd" in
build) build ;;
start) [ $# -eq 2 ] || { echo "usage: $0 start DIR PORT" >&2; exit 2; }; start "$@" ;;
createdb) [ $# -eq 3 ] || { echo "usage: $0 createdb DIR PORT NAME" >&2; exit 2; }; createdb "$@" ;;
dropdb) [ $# -eq 3 ] || { echo "usage: $0 dropdb DIR PORT NAME" >&2; exit 2; }; dropdb "$@" ;;
stop) [ $# -eq 1 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$@" ;;
*) echo "usage: $0 build | start DIR PORT | createdb DIR PORT NAME | dropdb DIR PORT NAME | stop DIR" >&2; exit 2 ;;
esac

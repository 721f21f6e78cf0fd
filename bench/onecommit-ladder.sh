#!/usr/bin/env bash
# The cost of each piece of the single commit (single_begin.sql,
# single_finish.sql): bench/sqlceiling.sh writes its scripts (kept in
# SQLCEILING_DIR), then each variant below drops one piece from the "single"
# script, and all run side by side, round after round, on the same database.
#   single          as the engine sends it
#   no_lock         without pg_try_advisory_xact_lock (what keeps no
#                   concurrent execution without Redis)
#   no_set_config   without the two set_config calls per transaction (what
#                   a session default set once per connection would cost: nothing)
#   no_exists       without the EXISTS probe of the key's row
#   no_floor        without the version floor read (version 1)
#   no_outbox       without the outbox row
#   no_expiry_index the single commit as sent, on a copy of DATABASE without
#                   the expiry index (idempotency_keys_expires_at_idx, which
#                   retention and the reconciler's scans use)
# Usage: bench/onecommit-ladder.sh HOST PORT DATABASE; BENCH_SECONDS (5),
# BENCH_CONNS (16), ROUNDS (3). Prints "round NAME TPS" lines.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$1 port=$2 db=$3
secs=${BENCH_SECONDS:-5} conns=${BENCH_CONNS:-16}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
SQLCEILING_DIR=$dir BENCH_SECONDS=1 BENCH_CONNS=2 bench/sqlceiling.sh "$host" "$port" "$db" >/dev/null
s=$dir/single.sql
variant() { # NAME SED-EXPRESSION: single.sql with the expression applied, which must change it
	sed "$2" "$s" >"$dir/$1.sql"
	! cmp -s "$s" "$dir/$1.sql" || { echo "onecommit-ladder: $1 changed nothing" >&2; exit 1; }
}
variant no_lock 's/pg_try_advisory_xact_lock(1330529093, :lock_id::integer)/true/'
variant no_set_config 's/, *set_config('"'"'statement_timeout'"'"', :lease_ms, true), *set_config('"'"'idle_in_transaction_session_timeout'"'"', :lease_ms, true)//'
variant no_exists 's/EXISTS (SELECT FROM idempotency_keys WHERE scope = :scope AND key = :key)/false/'
variant no_floor 's/coalesce((SELECT version FROM idempotency_version_floor), 0) + 1/1/'
variant no_outbox 's/INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM inserted/SELECT 1/'
copy=${db}_noexpiry
psql -h "$host" -p "$port" -U postgres -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null \
	-c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $copy" -c "CREATE DATABASE $copy TEMPLATE $db"
psql -h "$host" -p "$port" -U postgres -qX -v ON_ERROR_STOP=1 -d "$copy" -c "DROP INDEX idempotency_keys_expires_at_idx" >/dev/null
cp "$s" "$dir/no_expiry_index.sql"
defines=(-D scope=acct_bench -D fingerprint=v1:bench -D lease_ms=30000 -D "ttl=24 hours" -D channel=onceonly_outbox
	-D notify=false -D fail_when_lost=true -D count_failure=false -D status=completed -D response_status=201
	-D response_content_type=application/json -D 'response_body=\x7b7d' -D response_headers=-)
for round in $(seq "${ROUNDS:-3}"); do
	for name in bare single no_lock no_set_config no_exists no_floor no_outbox no_expiry_index; do
		target=$db
		[ "$name" = no_expiry_index ] && target=$copy
		out=$(pgbench -h "$host" -p "$port" -U postgres -n -M prepared -c "$conns" -j 2 -T "$secs" -f "$dir/$name.sql" \
			"${defines[@]}" "$target" 2>&1) || { echo "$out" >&2; exit 1; }
		echo "$round $name $(echo "$out" | awk '/^tps =/ {printf "%.0f", $3}')"
	done
done

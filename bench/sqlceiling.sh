#!/usr/bin/env bash
# The SQL ceiling of a first execution: pgbench runs the statements the
# engine sends, read from outbox/sql/ at run time, in the engine's round trips,
# with no Go, no HTTP and no Redis in the loop, beside the bare INSERT of the
# benchmark's handler and two floors that keep only what each shape cannot
# do without:
#   bare         the bare handler's INSERT, autocommit (variant (b))
#   default      claim_insert (its own commit, without waiting for the flush);
#                BEGIN with the payment's INSERT; finish with COMMIT
#   single       SingleCommit: BEGIN with single_begin; the INSERT;
#                single_finish with COMMIT
#   floor_2phase any design that commits a claim before the handler runs: a
#                one-index key table, the claim inserted (commit not waited
#                for), the payment, the key updated with the response, COMMIT;
#                no outbox, no version floor, no checks, no advisory lock
#   floor_1commit any design that writes the key once, with the handler's
#                commit: the payment, then the completed key row, COMMIT
# With SQLCEILING_LADDER=1, what the engine's default statements would gain
# from a leaner schema, each on a copy of DATABASE's schema:
#   default_hot  the completion keeps expires_at and the table has no lease
#                index (fillfactor 80): the completion is a HOT update
#   default_lean the same without the six CHECK constraints of idempotency_keys
# Usage: bench/sqlceiling.sh HOST PORT DATABASE (migrated by `api migrate
# up`); BENCH_SECONDS (10), BENCH_CONNS (32), SQLCEILING_ROUNDS (1): the
# scripts run one after the other, round after round. Prints "NAME TPS" lines.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$1 port=$2 db=$3
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
dir=${SQLCEILING_DIR:-$(mktemp -d)}
[ -n "${SQLCEILING_DIR:-}" ] || trap 'rm -rf "$dir"' EXIT

# statement FILE VALUE...: the statement in outbox/sql/FILE on one line,
# without its comments, each $N replaced by the Nth VALUE (a pgbench
# variable, so it still goes as a parameter of the prepared statement).
statement() {
	local file=$1
	shift
	awk -v values="$*" '
		BEGIN { split(values, v, " ") }
		!/^[ \t]*--/ { text = text " " $0 }
		END {
			gsub(/\t/, " ", text)
			while (match(text, /\$[0-9]+/)) {
				out = out substr(text, 1, RSTART - 1) v[substr(text, RSTART + 1, RLENGTH - 1) + 0]
				text = substr(text, RSTART + RLENGTH)
			}
			print out text ";"
		}' "outbox/sql/$file"
}

new_key='\set k random(1, 9000000000000)'
payment="INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status) VALUES ('pay_' || :k, 'acct_bench', :k, 1000, 'usd', 'cus_bench', 'succeeded');"
printf '%s\n' "$new_key" "$payment" >"$dir/bare.sql"
printf '%s\n' "$new_key" \
	"$(statement claim_insert.sql :scope :k :fp :owner :lease :ttl :no :yes)" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "$(statement finish.sql :scope :k :owner :completed :status :ctype :body :ttl :no :headers :yes)" 'COMMIT;' '\endpipeline' \
	>"$dir/default.sql"
printf '%s\n' "$new_key" \
	'\startpipeline' 'BEGIN;' "$(statement single_begin.sql :scope :k :lease_ms)" '\endpipeline' \
	"$payment" \
	'\startpipeline' "$(statement single_finish.sql :scope :k :completed :fp :status :ctype :body :headers :ttl :yes :no)" 'COMMIT;' '\endpipeline' \
	>"$dir/single.sql"
printf '%s\n' "$new_key" \
	"INSERT INTO ceiling_keys (scope, key, status, owner, version) VALUES (:scope, :k, 'in_progress', :owner, 1) ON CONFLICT DO NOTHING RETURNING version, set_config('synchronous_commit', 'off', true);" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "UPDATE ceiling_keys SET status = 'completed', owner = NULL, version = version + 1, response = :body WHERE scope = :scope AND key = :k AND owner = :owner RETURNING version;" 'COMMIT;' '\endpipeline' \
	>"$dir/floor_2phase.sql"
printf '%s\n' "$new_key" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "INSERT INTO ceiling_keys (scope, key, status, version, response) VALUES (:scope, :k, 'completed', 1, :body) ON CONFLICT DO NOTHING RETURNING version;" 'COMMIT;' '\endpipeline' \
	>"$dir/floor_1commit.sql"

sql() { psql -h "$host" -p "$port" -U postgres -qX -v ON_ERROR_STOP=1 "$@" >/dev/null; }
sql -d "$db" -c "SET client_min_messages = warning; CREATE TABLE IF NOT EXISTS ceiling_keys (scope text, key text, status text NOT NULL, owner uuid, version bigint NOT NULL, response bytea, PRIMARY KEY (scope, key))"

names="bare default single floor_2phase floor_1commit"
declare -A database=([bare]=$db [default]=$db [single]=$db [floor_2phase]=$db [floor_1commit]=$db)
if [ "${SQLCEILING_LADDER:-}" = 1 ]; then
	names="bare default default_hot default_lean single floor_2phase floor_1commit"
	hot_finish=$(sed 's/expires_at = now() + :ttl::interval, updated_at = now()/updated_at = now()/' "$dir/default.sql")
	[ "$hot_finish" != "$(cat "$dir/default.sql")" ] || { echo "sqlceiling: finish.sql no longer sets expires_at as the ladder expects" >&2; exit 1; }
	echo "$hot_finish" >"$dir/default_hot.sql"
	cp "$dir/default_hot.sql" "$dir/default_lean.sql"
	lean_schema="DROP INDEX idempotency_keys_lease_idx; ALTER TABLE idempotency_keys SET (fillfactor = 80);"
	no_checks="ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_check, DROP CONSTRAINT idempotency_keys_check1,
		DROP CONSTRAINT idempotency_keys_key_check, DROP CONSTRAINT idempotency_keys_scope_check,
		DROP CONSTRAINT idempotency_keys_status_check, DROP CONSTRAINT idempotency_keys_version_check;"
	for copy in hot lean; do
		database[default_$copy]=${db}_$copy
		sql -d postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS ${db}_$copy" -c "CREATE DATABASE ${db}_$copy"
		pg_dump -h "$host" -p "$port" -U postgres -s "$db" | sql -d "${db}_$copy"
	done
	sql -d "${db}_hot" -c "$lean_schema"
	sql -d "${db}_lean" -c "$lean_schema $no_checks"
fi

for round in $(seq "${SQLCEILING_ROUNDS:-1}"); do
for name in $names; do
	out=$(pgbench -h "$host" -p "$port" -U postgres -n -M prepared -c "$conns" -j 2 -T "$secs" -f "$dir/$name.sql" \
		-D scope=acct_bench -D fp=v1:bench -D owner=00000000-0000-0000-0000-0000000000b1 \
		-D lease='30 seconds' -D lease_ms=30000 -D ttl='24 hours' -D no=false -D yes=true \
		-D completed=completed -D status=201 -D ctype=application/json -D 'body=\x7b7d' -D headers=- \
		"${database[$name]}" 2>&1) || { echo "$out" >&2; exit 1; }
	failed=$(echo "$out" | awk '/number of failed transactions/ {print $5}')
	[ "${failed:-0}" = 0 ] || { echo "sqlceiling: $name: $failed transactions failed" >&2; echo "$out" >&2; exit 1; }
	echo "$name $(echo "$out" | awk '/^tps =/ {printf "%.0f", $3}')"
done
done # rounds
if [ "${SQLCEILING_LADDER:-}" = 1 ]; then
	sql -d postgres -c "DROP DATABASE ${db}_hot" -c "DROP DATABASE ${db}_lean"
fi

#!/usr/bin/env bash
# The SQL ceiling of a first execution: pgbench runs the statements the
# engine sends, read from outbox/sql/ at run time, in the engine's
# round trips, with no Go, no HTTP and no Redis in the loop, beside the bare
# INSERT of the benchmark's handler and two floors that keep only what each
# shape cannot do without:
#   bare         the bare handler's INSERT, autocommit (variant (b))
#   default      TwoPhase: claim_insert (its own commit, without waiting for the flush);
#                BEGIN with the payment's INSERT; finish with COMMIT
#   single       the default (one commit until a step): BEGIN with single_begin,
#                single_probe and the savepoint; the INSERT;
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
# Each named parameter of a statement (@name) goes to pgbench as the variable
# :name (the values below; :key is the new key of each transaction), and
# {{key_columns}} markers are expanded as outbox/sql.go expands
# them; @channel is outbox.NotifyChannel, read from outbox/store.go.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$1 port=$2 db=$3
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
dir=${SQLCEILING_DIR:-$(mktemp -d)}
[ -n "${SQLCEILING_DIR:-}" ] || trap 'rm -rf "$dir"' EXIT

# The value of each named parameter the statements take, by name: pgbench
# sends it as the parameter of the prepared statement (-D name=value); key
# is set per transaction (\set key) instead.
channel=$(sed -n 's/^const NotifyChannel = "\([^"]*\)"$/\1/p' outbox/store.go)
[ -n "$channel" ] || { echo "sqlceiling: no const NotifyChannel in outbox/store.go" >&2; exit 1; }
declare -A value=(
	[scope]=acct_bench [fingerprint]=v1:bench [owner]=00000000-0000-0000-0000-0000000000b1
	[lease]='30 seconds' [lease_ms]=30000 [ttl]='24 hours' [channel]=$channel
	[notify]=false [async_commit]=true [fail_when_lost]=true [count_failure]=false
	[status]=completed [response_status]=201 [response_content_type]=application/json
	[response_body]='\x7b7d' [response_headers]=- [take_lock]=false
)
defines=()
for name in "${!value[@]}"; do defines+=(-D "$name=${value[$name]}"); done

# statement NAME: outbox/sql/NAME.sql on one line, as sql.go
# loads it: each {{key_columns}} marker replaced by the lines of
# key_columns.sql after its leading comment, @max_body in them by NULL
# ({{key_columns}}) or by the marker's parameter ({{key_columns @name}});
# then without its comment lines, each named parameter @name (outside quotes,
# as pgx reads it) replaced by the pgbench variable :name, so it still goes
# as a parameter of the prepared statement. A parameter with no value above,
# a $N, an unknown marker or a comment inside a line is an error.
statement() {
	local file=outbox/sql/$1.sql
	awk -v file="$file" -v columns_file=outbox/sql/key_columns.sql -v names="key lock_id ${!value[*]}" '
		function fail(msg) { print "sqlceiling: " file ": " msg > "/dev/stderr"; failed = 1; exit 1 }
		BEGIN {
			split(names, n, " ")
			for (i in n) known[n[i]] = 1
			# key_columns.sql as sql.go reads it: trimmed, then without the
			# "--" lines it starts with.
			nc = 0
			while ((r = (getline line < columns_file)) > 0) c[++nc] = line
			if (r < 0) fail("cannot read " columns_file)
			first = 1
			while (first <= nc && c[first] ~ /^[ \t\r]*$/) first++
			while (nc >= first && c[nc] ~ /^[ \t\r]*$/) nc--
			if (first <= nc) sub(/^[ \t\r]+/, "", c[first])
			while (first <= nc && c[first] ~ /^--/) first++
			if (first > nc) fail(columns_file " has no columns")
			columns = ""
			for (i = first; i <= nc; i++) columns = columns (i > first ? "\n" : "") c[i]
			sub(/[ \t\r]+$/, "", columns)
		}
		{
			# A marker stands in the statement, not in a comment.
			if (index($0, "{{") && (d = index($0, "--")) && d < index($0, "{{")) fail("marker in a comment: " $0)
			text = text $0 "\n"
		}
		END {
			if (failed) exit 1
			if (text == "") fail("missing or empty")
			# The markers.
			out = ""
			while (match(text, /\{\{[^{}]*\}\}/)) {
				marker = substr(text, RSTART, RLENGTH)
				k = split(substr(text, RSTART + 2, RLENGTH - 4), f, " ")
				# The key lock markers as sql.go expands them on one Postgres.
				if (k == 1 && f[1] == "key_locked") expansion = "CASE WHEN pg_try_advisory_xact_lock(1330529093, @lock_id::integer) THEN true ELSE onceonly_key_busy(@scope, @key) END"
				else if (k == 2 && f[1] == "try_key_lock") expansion = "pg_try_advisory_xact_lock(1330529093, " f[2] ")"
				else {
					if (k == 1 && f[1] == "key_columns") arg = "NULL"
					else if (k == 2 && f[1] == "key_columns" && f[2] ~ /^@./) arg = f[2]
					else fail("unknown marker " marker)
					expansion = columns; gsub(/@max_body/, arg, expansion)
				}
				out = out substr(text, 1, RSTART - 1) expansion
				text = substr(text, RSTART + RLENGTH)
			}
			text = out text
			# One line, without the comment lines.
			nl = split(text, lines, "\n"); text = ""
			for (i = 1; i <= nl; i++) if (lines[i] !~ /^[ \t]*--/) text = text " " lines[i]
			gsub(/[\t\r]/, " ", text)
			# The named parameters, outside quoted strings and identifiers.
			out = ""; quote = ""; len = length(text)
			for (i = 1; i <= len; i++) {
				ch = substr(text, i, 1)
				if (quote != "") { if (ch == quote) quote = ""; out = out ch; continue }
				if (ch == "\047" || ch == "\"") { quote = ch; out = out ch; continue }
				two = substr(text, i, 2)
				if (two == "--" || two == "/*") fail("a comment inside a line: write it on lines of its own")
				if (ch == "$" && substr(text, i + 1, 1) ~ /[0-9]/) fail("positional parameter: the statements name theirs (@name)")
				if (ch == "@" && substr(text, i + 1, 1) ~ /[A-Za-z_]/) {
					j = i + 1
					while (j <= len && substr(text, j, 1) ~ /[A-Za-z0-9_]/) j++
					name = substr(text, i + 1, j - i - 1)
					if (!(name in known)) fail("@" name " has no value in bench/sqlceiling.sh")
					out = out ":" name; i = j - 1; continue
				}
				out = out ch
			}
			if (quote != "") fail("unterminated quote")
			sub(/^ +/, "", out); sub(/ +$/, "", out)
			print out ";"
		}' "$file"
}

# Each statement once, so that a statement that fails to load stops the script.
claim_insert=$(statement claim_insert)
finish=$(statement finish)
single_begin=$(statement single_begin)
single_probe=$(statement single_probe)
single_finish=$(statement single_finish)

# A key, and its lock id (the engine derives it from the key and the
# database's secret; any 32 bits do here).
new_key='\set key random(1, 9000000000000)
\set lock_id random(-2147483648, 2147483647)'
payment="INSERT INTO payments (id, merchant_id, idempotency_key, amount, currency, customer, status) VALUES ('pay_' || :key, 'acct_bench', :key, 1000, 'usd', 'cus_bench', 'succeeded');"
printf '%s\n' "$new_key" "$payment" >"$dir/bare.sql"
printf '%s\n' "$new_key" \
	"$claim_insert" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "$finish" 'COMMIT;' '\endpipeline' \
	>"$dir/default.sql"
printf '%s\n' "$new_key" \
	'\startpipeline' 'BEGIN;' "$single_begin" "$single_probe" 'SAVEPOINT onceonly_execution;' '\endpipeline' \
	"$payment" \
	'\startpipeline' "$single_finish" 'COMMIT;' '\endpipeline' \
	>"$dir/single.sql"
printf '%s\n' "$new_key" \
	"INSERT INTO ceiling_keys (scope, key, status, owner, version) VALUES (:scope, :key, 'in_progress', :owner, 1) ON CONFLICT DO NOTHING RETURNING version, set_config('synchronous_commit', 'off', true);" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "UPDATE ceiling_keys SET status = 'completed', owner = NULL, version = version + 1, response = :response_body WHERE scope = :scope AND key = :key AND owner = :owner RETURNING version;" 'COMMIT;' '\endpipeline' \
	>"$dir/floor_2phase.sql"
printf '%s\n' "$new_key" \
	'\startpipeline' 'BEGIN;' "$payment" '\endpipeline' \
	'\startpipeline' "INSERT INTO ceiling_keys (scope, key, status, version, response) VALUES (:scope, :key, 'completed', 1, :response_body) ON CONFLICT DO NOTHING RETURNING version;" 'COMMIT;' '\endpipeline' \
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
		"${defines[@]}" "${database[$name]}" 2>&1) || { echo "$out" >&2; exit 1; }
	failed=$(echo "$out" | awk '/number of failed transactions/ {print $5}')
	[ "${failed:-0}" = 0 ] || { echo "sqlceiling: $name: $failed transactions failed" >&2; echo "$out" >&2; exit 1; }
	echo "$name $(echo "$out" | awk '/^tps =/ {printf "%.0f", $3}')"
done
done # rounds
if [ "${SQLCEILING_LADDER:-}" = 1 ]; then
	sql -d postgres -c "DROP DATABASE ${db}_hot" -c "DROP DATABASE ${db}_lean"
fi

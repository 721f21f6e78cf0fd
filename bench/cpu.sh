# CPU seconds of the benchmark's servers, sourced by bench/relay.sh and
# bench/reconcile.sh.

# redis_cpu PORT...: user + system CPU seconds of the Redis servers on PORTs.
redis_cpu() {
	local p
	for p in "$@"; do redis-cli -p "$p" info cpu; done |
		awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.2f", s }'
}

# pg_cpu DIR: CPU seconds of the Postgres whose data lives in DIR/pg (the
# postmaster and its children, living and exited). cat, not awk, opens the
# files: a process may exit meanwhile, which stops mawk.
pg_cpu() {
	cat /proc/[0-9]*/stat 2>/dev/null | awk -v pm="$(head -1 "$1/pg/postmaster.pid")" '{
		pid = $1; sub(/^.*\) /, "")
		if (pid == pm) s += $12 + $13 + $14 + $15; else if ($2 == pm) s += $12 + $13
	} END { printf "%.2f", s / 100 }'
}

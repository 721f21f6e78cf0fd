-- keys_by_state_estimate: the number of keys per state as the planner's
-- statistics estimate it, for a table too large to count on every page
-- view: the table's row estimate (pg_class.reltuples) times each state's
-- share among the rows ANALYZE sampled (pg_stats). No row when the table
-- was never analyzed. analyzed_ago_ms says how old the estimate is.
SELECT s.status, round(c.reltuples * s.freq)::bigint,
	(extract(epoch FROM now() - greatest(t.last_analyze, t.last_autoanalyze)) * 1000)::bigint AS analyzed_ago_ms
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stats st ON st.schemaname = n.nspname AND st.tablename = c.relname AND st.attname = 'status'
JOIN pg_stat_user_tables t ON t.relid = c.oid
CROSS JOIN LATERAL unnest(st.most_common_vals::text::text[], st.most_common_freqs) AS s(status, freq)
WHERE c.oid = 'idempotency_keys'::regclass AND c.reltuples >= 0

-- table_size: the planner's row estimate of idempotency_keys (-1 when
-- never vacuumed or analyzed): whether keys_by_state may count exactly.
SELECT reltuples::bigint FROM pg_class WHERE oid = 'idempotency_keys'::regclass

-- oldest_leases: the executions in progress whose lease ends first (or
-- ended longest ago), through the partial index on leases.
--
-- @limit
SELECT scope, key, version, (extract(epoch FROM lease_expires_at - now()) * 1000)::bigint AS lease_ms,
	(extract(epoch FROM now() - created_at) * 1000)::bigint AS age_ms, coalesce(handler, ''),
	steps IS NOT NULL AS stepped
FROM idempotency_keys
WHERE status = 'in_progress'
ORDER BY lease_expires_at
LIMIT @limit::bigint

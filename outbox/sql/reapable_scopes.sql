-- reapable_scopes: on a distributed database (Citus), the scopes that hold
-- the keys reap_leases would reap next, found by one read of every shard
-- (no lock): reap_leases then runs scope by scope.
--
-- @grace (interval)   @limit
SELECT DISTINCT scope FROM (
	SELECT scope FROM idempotency_keys
	WHERE status = 'in_progress' AND lease_expires_at < now() - @grace::interval AND steps IS NULL
	ORDER BY lease_expires_at LIMIT @limit
) dead

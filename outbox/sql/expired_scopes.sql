-- expired_scopes: on a distributed database (Citus), the scopes that hold
-- the keys delete_expired would delete next, found by one read of every
-- shard (no lock): delete_expired then runs scope by scope.
--
-- @limit
SELECT DISTINCT scope FROM (
	SELECT scope FROM idempotency_keys
	WHERE expires_at <= now() AND version <= (SELECT version FROM idempotency_version_floor)
	ORDER BY expires_at LIMIT @limit
) old

-- resumable_scopes: on a distributed database (Citus), the scopes that
-- hold the executions resume_claim would take next, found by one read of
-- every shard (no lock): resume_claim then runs scope by scope.
--
-- @handlers (text[])   @limit
SELECT DISTINCT scope FROM (
	SELECT scope FROM idempotency_keys
	WHERE status = 'in_progress' AND lease_expires_at <= now() AND steps IS NOT NULL
		AND handler = ANY(@handlers::text[]) AND expires_at > now()
	ORDER BY lease_expires_at LIMIT @limit
) due

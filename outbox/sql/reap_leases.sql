-- reap_leases: marks up to @limit keys whose lease ran out more than @grace
-- ago failed (retryable), as a fail would: one version up, with an outbox
-- event, so a key whose worker died is released even if no client retries.
-- An execution that started a step (steps is set) is not reaped: it may
-- have reached an external system, and a live engine resumes it instead.
-- Rows other transactions hold are skipped; the next pass gets them. It
-- notifies the relays (on @channel) when it reaped any.
--
-- @grace (interval)   @ttl: how long a failed row lives (interval)   @limit
-- Returns how many keys it reaped.
-- The and_scope markers: on a distributed database (Citus) the statement
--    runs scope by scope (@scope), on one shard (reapable_scopes finds the scopes);
--    on one Postgres they are left out.
WITH dead AS (
	SELECT scope, key FROM idempotency_keys
	WHERE status = 'in_progress' AND lease_expires_at < now() - @grace::interval AND steps IS NULL {{and_scope}}
	ORDER BY lease_expires_at LIMIT @limit FOR UPDATE SKIP LOCKED
), reaped AS (
	UPDATE idempotency_keys AS k SET
		status = 'failed', version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		expires_at = now() + @ttl::interval, updated_at = now()
	FROM dead WHERE k.scope = dead.scope AND k.key = dead.key {{and_scope k}}
	RETURNING k.scope, k.key, k.version
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM reaped
)
SELECT count(*), coalesce(bool_or(pg_notify(@channel, '') IS NULL), false) AS notified
FROM reaped

-- purge: forgets a key. It expires the row now, one version up, with its
-- outbox event: the relay deletes the Redis copy, the next claim starts a
-- new lifecycle that keeps counting versions (so no stale copy outranks
-- it), and retention deletes the row. A held key (only with @force)
-- becomes failed, so its worker can no longer complete it. It notifies the
-- relays (on @channel) in its transaction.
--
-- @scope   @key   @force
WITH purged AS (
	UPDATE idempotency_keys AS k SET version = k.version + 1, expires_at = now(), updated_at = now(),
		status = CASE WHEN k.status = 'in_progress' THEN 'failed' ELSE k.status END,
		owner = NULL, lease_expires_at = NULL
	WHERE k.scope = @scope AND k.key = @key AND (k.status <> 'in_progress' OR @force)
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM purged
)
SELECT {{key_columns}},
	pg_notify(@channel, '') IS NULL AS notified
FROM purged k

-- purge: forgets a key. It expires the row now, one version up, with its
-- outbox event: the relay deletes the Redis copy, the next claim starts a
-- new lifecycle that keeps counting versions (so no stale copy outranks
-- it), and retention deletes the row. A held key (only with @force)
-- becomes failed, so its worker can no longer complete it. It notifies the
-- relays in its transaction.
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
SELECT k.scope, k.key, k.status, k.version, k.fingerprint,
	'00000000-0000-0000-0000-000000000000'::uuid AS owner, 0::bigint AS lease_ms,
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), coalesce(k.response_headers, ''), k.response_body, false AS body_omitted,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_ms,
	pg_notify('onceonly_outbox', '') IS NULL AS notified
FROM purged k

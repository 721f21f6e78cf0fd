-- claim_takeover: claims a row that claim_peek found takeable, if it still
-- is: in_progress under the caller's owner and lease, one version up, with
-- its outbox event. No row comes back when another claim took it first (or
-- retention deleted it): peek again. It takes the key's lock (@lock_id)
-- first, as claim_insert does, and fails with SQLSTATE OO002 when another
-- transaction holds it.
--
-- Taking over an execution whose lease ran out keeps what it recorded (its
-- handler, request and steps), so the new holder continues from its last
-- recovery point; a failed or expired row starts afresh. The key's failures
-- carry over to the retry of a failed row (a consumer counts them), and
-- start again at 0 with a new lifecycle (an expired row).
--
-- @scope   @key   @lock_id (integer)   @fingerprint   @owner (uuid)   @lease (interval)
-- @ttl: how long the row lives (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @async_commit: commit without waiting for the WAL flush (the claim
--    commits on its own)
-- @live   @in_progress: the row as claim_peek found it, unexpired or not,
--    in progress or not. A row that is no longer so changed since: no row
--    comes back, and the claim peeks again. Passing what the peek found,
--    rather than testing now() in the CASEs below, keeps the statement one
--    that Citus runs (it refuses now() inside a CASE of an UPDATE).
WITH claimed AS (
	UPDATE idempotency_keys AS k SET
		status = 'in_progress', version = k.version + 1, fingerprint = @fingerprint,
		owner = @owner, lease_expires_at = now() + @lease::interval,
		expires_at = now() + @ttl::interval, updated_at = now(),
		response_status = NULL, response_content_type = NULL, response_headers = NULL, response_body = NULL,
		handler = CASE WHEN @in_progress AND @live THEN k.handler END,
		request = CASE WHEN @in_progress AND @live THEN k.request END,
		steps = CASE WHEN @in_progress AND @live THEN k.steps END,
		failures = CASE WHEN @live THEN k.failures ELSE 0 END
	WHERE {{key_locked}} AND k.scope = @scope AND k.key = @key
		AND (k.expires_at > now()) = @live AND (k.status = 'in_progress') = @in_progress
		AND (k.expires_at <= now()
			OR (k.fingerprint = @fingerprint AND (k.status = 'failed'
				OR (k.status = 'in_progress' AND k.lease_expires_at <= now()))))
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified,
	set_config('synchronous_commit', CASE WHEN @async_commit THEN 'off' ELSE current_setting('synchronous_commit') END, true),
	k.steps
FROM claimed k

-- finish: moves a key the caller's owner holds to completed (with the
-- response) or failed, one version up, with its outbox event; the request
-- kept for resumption is dropped, the steps stay for the record. A fail
-- with @count_failure (the handler failed, not the store or the caller)
-- adds one to the key's failures. Completing
-- runs inside the caller's business transaction, so both commit together.
-- When the owner no longer holds the key (lease lost), no row comes back —
-- or, with @fail_when_lost, the statement fails (onceonly_lease_lost,
-- SQLSTATE OO001): the engine sends its COMMIT in the same round trip, and
-- Postgres skips a COMMIT that follows a failed statement.
--
-- @scope   @key   @owner (uuid)   @status ('completed' | 'failed')
-- @response_status   @response_content_type   @response_body
-- @response_headers (keystate.EncodeHeader)
-- @ttl: how long the row lives from now (interval)
-- @count_failure: add one to failures (a failed handler)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @fail_when_lost: fail instead of returning no row
WITH finished AS (
	UPDATE idempotency_keys AS k SET
		status = @status, version = k.version + 1, owner = NULL, lease_expires_at = NULL,
		response_status = @response_status, response_content_type = @response_content_type,
		response_body = @response_body, response_headers = @response_headers,
		request = NULL, failures = k.failures + CASE WHEN @count_failure THEN 1 ELSE 0 END,
		expires_at = now() + @ttl::interval, updated_at = now()
	WHERE k.scope = @scope AND k.key = @key AND k.owner = @owner AND k.status = 'in_progress'
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM finished
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified
FROM (VALUES (true)) AS one (row)
	LEFT JOIN finished k ON true
WHERE CASE WHEN k.scope IS NOT NULL THEN true WHEN @fail_when_lost THEN onceonly_lease_lost(@scope, @key) ELSE false END

-- single_finish: records the end of a single-commit execution as the key's
-- first and only row, at the version floor + 1, with its outbox event:
-- completed with the response inside the execution's transaction, which
-- commits with it; or failed after that transaction rolled back, so a later
-- request with another payload is still refused (I3) and a retry runs again;
-- its failures are 1 with @count_failure (the handler failed, not the store
-- or the caller), else 0. The row is always the key's first, so there is no
-- earlier count to add to.
-- When the key has a row by now, nothing is written and no row comes back
-- — or, with @fail_when_lost, the statement fails (onceonly_lease_lost), so
-- the COMMIT sent behind it is skipped.
--
-- Inside the execution's transaction the key's lock is held already. A
-- failed row written after that transaction ended (its connection died, a
-- COMMIT whose outcome is unknown) is written with @take_lock: only if the
-- key's lock can be taken, so never while another execution of the key
-- runs (it would discard that execution's result); nothing is written
-- otherwise, and that execution's end decides the key.
--
-- @scope   @key   @status ('completed' | 'failed')   @fingerprint
-- @response_status   @response_content_type   @response_body
-- @response_headers (keystate.EncodeHeader)
-- @ttl: how long the row lives (interval)
-- @count_failure: count this execution among the key's failures
-- @fail_when_lost: fail instead of returning no row
-- @take_lock: take the key's lock (@lock_id, integer) first, and write
--    nothing when another transaction holds it
-- @notify: notify the relays (on @channel) in this statement's transaction
-- The row is inserted from a SELECT, not VALUES: Citus refuses a subquery
-- (the floor's) inside VALUES; Postgres plans both alike.
WITH inserted AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint,
		 response_status, response_content_type, response_body, response_headers, expires_at, failures)
	SELECT @scope, @key, @status, coalesce((SELECT version FROM idempotency_version_floor), 0) + 1, @fingerprint,
		@response_status::integer, @response_content_type, @response_body::bytea, @response_headers, now() + @ttl::interval,
		CASE WHEN @count_failure THEN 1 ELSE 0 END
	WHERE CASE WHEN @take_lock THEN {{try_key_lock @lock_id::integer}} ELSE true END
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM inserted
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified
FROM (VALUES (true)) AS one (row)
	LEFT JOIN inserted k ON true
WHERE CASE WHEN k.scope IS NOT NULL THEN true WHEN @fail_when_lost THEN onceonly_lease_lost(@scope, @key) ELSE false END

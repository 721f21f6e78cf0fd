-- claim_insert: claims a key that has no row. The key becomes in_progress
-- under the caller's owner and lease, with its outbox event, at the version
-- floor + 1 (1 on a database that never deleted a key): above any version
-- the key reached before retention deleted it (raise_version_floor), so its
-- versions never repeat. No row comes back when the key already has a row:
-- read it (claim_peek). It takes the key's lock first (@lock_id): when
-- another transaction holds it, an execution of the key is under way, and
-- the statement fails with SQLSTATE OO002 (onceonly_key_busy).
--
-- The lease runs from the statement, not from its transaction's start
-- (now()): a one-commit execution's promotion (QueueSinglePromote) sends
-- this in a transaction that may have begun leases ago, and its holder
-- counts its lease from the promotion.
--
-- @scope   @key   @lock_id (integer)   @fingerprint   @owner (uuid)   @lease (interval)
-- @ttl: how long the row lives (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @async_commit: commit without waiting for the WAL flush (the claim
--    commits on its own)
-- The row is inserted from a SELECT, not VALUES: Citus refuses a subquery
-- (the floor's) inside VALUES; Postgres plans both alike.
WITH claimed AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
	SELECT @scope, @key, 'in_progress', coalesce((SELECT version FROM idempotency_version_floor), 0) + 1,
		@fingerprint, @owner::uuid, statement_timestamp() + @lease::interval, now() + @ttl::interval
	WHERE {{key_locked}}
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified,
	set_config('synchronous_commit', CASE WHEN @async_commit THEN 'off' ELSE current_setting('synchronous_commit') END, true),
	NULL::jsonb AS steps
FROM claimed k

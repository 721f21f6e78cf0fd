-- hand_off: ends the caller's lease on an execution it cannot finish now
-- (a step's outcome is unknown, or its final transaction failed after a
-- step) without failing it: the lease expires now, one version up, with its
-- outbox event, so the next client retry or a live engine's resumer takes it
-- over at once and continues from its recovery points.
--
-- @scope   @key   @owner (uuid)
-- @notify: notify the relays (on @channel) in this statement's transaction
WITH handed AS (
	UPDATE idempotency_keys AS k SET version = k.version + 1, lease_expires_at = now(), updated_at = now()
	WHERE k.scope = @scope AND k.key = @key AND k.owner = @owner AND k.status = 'in_progress'
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM handed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified
FROM handed k

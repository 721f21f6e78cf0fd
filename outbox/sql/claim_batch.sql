-- claim_batch: claim_insert for several keys at once, in one statement and
-- one commit (the engine sends the claims of concurrent executions
-- together). Each key that has no row becomes in_progress under its own
-- owner and the shared lease, with its outbox event, at the version floor
-- + 1; a key that has a row, or whose lock another transaction holds (an
-- execution of it is under way: the batch takes each key's lock first),
-- comes back with no row: claim it alone, from claim_peek. A key twice in
-- the batch is inserted once.
--
-- The keys are inserted in (scope, key) order, so two batches that meet on
-- the same keys wait for each other in the same order and never deadlock.
-- An insert waits for another transaction that inserted the same key and
-- has not ended yet (a DoTx claim inside a caller's transaction may stay
-- open long); lock_timeout ends such a wait, and the batch with it, so one
-- key cannot hold up the others: the engine then claims each key alone.
-- With @notify it is left as it is: the NOTIFY's commit waits for a
-- database-wide lock, which a lock_timeout would turn into failed batches
-- under load.
--
-- @scopes   @keys   @lock_ids (integer)   @fingerprints   @owners (uuid text): one per key
-- @lease (interval)   @ttl: how long the rows live (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
-- @lock_timeout (text, e.g. '100ms')
-- The batch commits without waiting for the WAL flush, as claim_insert does
-- outside a transaction.
WITH settings AS MATERIALIZED (
	SELECT set_config('lock_timeout', CASE WHEN @notify THEN current_setting('lock_timeout') ELSE @lock_timeout END, true),
		set_config('synchronous_commit', 'off', true) AS durability
), input AS MATERIALIZED (
	SELECT i.scope, i.key, i.lock_id, i.fingerprint, i.owner
	FROM settings, unnest(@scopes::text[], @keys::text[], @lock_ids::integer[], @fingerprints::text[], @owners::uuid[])
		AS i (scope, key, lock_id, fingerprint, owner)
	ORDER BY i.scope, i.key
), locked AS MATERIALIZED (
	SELECT scope, key, fingerprint, owner FROM input WHERE {{try_key_lock lock_id}}
), claimed AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
	SELECT scope, key, 'in_progress', coalesce((SELECT version FROM idempotency_version_floor), 0) + 1,
		fingerprint, owner, now() + @lease::interval, now() + @ttl::interval
	FROM locked
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT {{key_columns}},
	(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified,
	s.durability,
	NULL::jsonb AS steps
FROM claimed k, settings s

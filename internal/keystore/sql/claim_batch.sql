-- claim_batch: claim_insert for several keys at once, in one statement and
-- one commit (the engine sends the claims of concurrent executions
-- together). Each key that has no row becomes in_progress under its own
-- owner and the shared lease, with its outbox event, at the version floor
-- + 1; a key that has a row comes back with no row: claim it alone, from
-- claim_peek. A key twice in the batch is inserted once.
--
-- The keys are inserted in (scope, key) order, so two batches that meet on
-- the same keys wait for each other in the same order and never deadlock.
-- An insert waits for another transaction that inserted the same key and
-- has not ended yet (a DoTx claim inside a caller's transaction may stay
-- open long); lock_timeout ends such a wait, and the batch with it, so one
-- key cannot hold up the others: the engine then claims each key alone.
-- With $7 it is left as it is: the NOTIFY's commit waits for a
-- database-wide lock, which a lock_timeout would turn into failed batches
-- under load.
--
-- $1 scopes   $2 keys   $3 fingerprints   $4 owners (uuid text), one per key
-- $5 lease (interval)   $6 how long the rows live (interval)
-- $7 notify the relays in this statement's transaction
-- $8 lock_timeout (text, e.g. '100ms')
-- The batch commits without waiting for the WAL flush, as claim_insert does
-- outside a transaction.
WITH settings AS MATERIALIZED (
	SELECT set_config('lock_timeout', CASE WHEN $7 THEN current_setting('lock_timeout') ELSE $8 END, true),
		set_config('synchronous_commit', 'off', true) AS durability
), input AS MATERIALIZED (
	SELECT i.scope, i.key, i.fingerprint, i.owner
	FROM settings, unnest($1::text[], $2::text[], $3::text[], $4::uuid[]) AS i (scope, key, fingerprint, owner)
	ORDER BY i.scope, i.key
), claimed AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
	SELECT scope, key, 'in_progress', coalesce((SELECT version FROM idempotency_version_floor), 0) + 1,
		fingerprint, owner, now() + $5::interval, now() + $6::interval
	FROM input
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM claimed
)
SELECT k.scope, k.key, k.status, k.version, k.fingerprint, k.owner,
	(extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint AS lease_ms,
	0 AS response_status, '' AS response_content_type, '' AS response_headers, NULL::bytea AS response_body, false AS body_omitted,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_ms,
	(CASE WHEN $7 THEN pg_notify('onceonly_outbox', '') END) IS NULL AS notified,
	s.durability,
	NULL::jsonb AS steps
FROM claimed k, settings s

-- take_batch: the relay's take. Deletes up to @limit of the oldest unparked
-- events that no other transaction holds and returns each with the current
-- row of its key, read in the same snapshot (the key columns of
-- current_keys; found is false when the key is gone). One statement, one
-- round trip: the relay sends it in the same round trip as its BEGIN.
--
-- The ids are locked first (FOR UPDATE SKIP LOCKED, so the LIMIT and the
-- locks apply once whatever plan the DELETE gets) and the rows deleted by
-- ctid: a locked row cannot move, and a TID scan saves a second index
-- lookup per event. The deletes belong to the caller's transaction,
-- committed only once Redis acknowledged the events (I9).
--
-- The transaction commits without waiting for its WAL flush
-- (synchronous_commit off): a deletion lost in a crash puts the events back,
-- and delivering them again is harmless (I8).
--
-- @limit   @max_body: largest body read (longer ones: body_omitted)
WITH taken AS (
	DELETE FROM outbox
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT @limit FOR UPDATE SKIP LOCKED))
	RETURNING id, scope, key, version, created_at, attempts
), durability AS MATERIALIZED (
	SELECT set_config('synchronous_commit', 'off', true)
)
SELECT coalesce(k.scope, t.scope), coalesce(k.key, t.key), coalesce(k.status, ''), coalesce(k.version, 0),
	coalesce(k.fingerprint, ''),
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner,
	coalesce((extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint, 0) AS lease_ms,
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), coalesce(k.response_headers, ''),
	CASE WHEN octet_length(k.response_body) <= @max_body THEN k.response_body END AS response_body,
	coalesce(octet_length(k.response_body) > @max_body, false) AS body_omitted,
	coalesce((extract(epoch FROM k.expires_at - now()) * 1000)::bigint, 0) AS expires_ms,
	k.scope IS NOT NULL AS found, t.id, t.version, t.created_at, t.attempts
FROM taken t
CROSS JOIN durability
LEFT JOIN idempotency_keys k ON k.scope = t.scope AND k.key = t.key

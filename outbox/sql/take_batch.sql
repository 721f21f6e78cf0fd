-- take_batch: the relay's take. Deletes up to @limit of the oldest unparked
-- events that no other transaction holds and returns each with the current
-- row of its key, read in the same snapshot (its key columns, bodies
-- limited as current_keys limits them; found is false when the key is
-- gone), then the event's columns. One statement, one round trip: the
-- relay sends it in the same round trip as its BEGIN.
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
-- The and_scope markers: on a distributed database (Citus) the statement
--    runs scope by scope (@scope), on one shard (outbox_scopes finds the scopes);
--    on one Postgres they are left out.
WITH taken AS (
	DELETE FROM outbox
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM outbox WHERE parked_at IS NULL {{and_scope}} ORDER BY id LIMIT @limit FOR UPDATE SKIP LOCKED))
		{{and_scope}}
	RETURNING id, scope, key, version, created_at, attempts
), durability AS MATERIALIZED (
	SELECT set_config('synchronous_commit', 'off', true)
)
SELECT {{key_columns @max_body}},
	k.scope IS NOT NULL AS found, t.id, t.scope, t.key, t.version, t.created_at, t.attempts
FROM taken t
CROSS JOIN durability
LEFT JOIN idempotency_keys k ON k.scope = t.scope AND k.key = t.key {{and_scope k}}

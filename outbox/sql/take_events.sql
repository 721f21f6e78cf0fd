-- take_events: deletes up to $1 of the oldest unparked events that no other
-- transaction holds, and returns them. The ids are materialized first so the
-- LIMIT and the row locks apply once, whatever plan the DELETE gets. The
-- deletes belong to the caller's transaction, committed only once Redis
-- acknowledged the events.
--
-- $1 limit
WITH ids AS MATERIALIZED (
	SELECT id FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox o USING ids
WHERE o.id = ids.id
RETURNING o.id, o.scope, o.key, o.version, o.created_at, o.attempts

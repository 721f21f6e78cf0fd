-- unpark_events: puts parked outbox events (@ids) back in the relays'
-- queue, their attempts counted from zero again; last_error stays as the
-- reason they were parked until a new attempt replaces it. Events that are
-- not parked (gone, or unparked already) are left alone. It notifies the
-- relays (on @channel) when it unparked any.
--
-- @ids (bigint[])
-- Returns how many events it unparked.
WITH unparked AS (
	UPDATE outbox SET parked_at = NULL, attempts = 0
	WHERE id = ANY(@ids::bigint[]) AND parked_at IS NOT NULL
	RETURNING id
)
SELECT count(*), coalesce(bool_or(pg_notify(@channel, '') IS NULL), false) AS notified
FROM unparked

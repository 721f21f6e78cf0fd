-- count_events: events waiting for delivery, parked ones, and how long the
-- oldest waiting one has waited (the database's clock; 0 when none waits):
-- a relay that has stopped shows as that age growing, whatever the backlog.
SELECT count(*) FILTER (WHERE parked_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL),
	coalesce((SELECT (extract(epoch FROM now() - created_at) * 1000)::bigint
		FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT 1), 0)
FROM outbox

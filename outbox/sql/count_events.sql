-- count_events: events waiting for delivery, parked ones, and how long the
-- oldest waiting one has waited (the database's clock; 0 when none waits):
-- a relay that has stopped shows as that age growing, whatever the backlog.
-- The oldest is read in a FROM item, not a subquery of the select list,
-- which Citus cannot run on a distributed outbox.
SELECT c.pending, c.parked,
	coalesce((extract(epoch FROM now() - o.created_at) * 1000)::bigint, 0)
FROM (
	SELECT count(*) FILTER (WHERE parked_at IS NULL) AS pending, count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked
	FROM outbox
) c LEFT JOIN (
	SELECT created_at FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT 1
) o ON true

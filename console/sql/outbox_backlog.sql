-- outbox_backlog: the relay's backlog: events waiting and parked (each
-- counted up to @cap), and the age of the oldest of each (0 when none).
--
-- @cap
SELECT
	(SELECT count(*) FROM (SELECT 1 FROM outbox WHERE parked_at IS NULL LIMIT @cap::bigint) p),
	(SELECT count(*) FROM (SELECT 1 FROM outbox WHERE parked_at IS NOT NULL LIMIT @cap::bigint) p),
	coalesce((SELECT (extract(epoch FROM now() - created_at) * 1000)::bigint
		FROM outbox WHERE parked_at IS NULL ORDER BY id LIMIT 1), 0),
	coalesce((SELECT (extract(epoch FROM now() - created_at) * 1000)::bigint
		FROM outbox WHERE parked_at IS NOT NULL ORDER BY id LIMIT 1), 0)

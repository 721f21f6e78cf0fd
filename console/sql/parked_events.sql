-- parked_events: one page of the parked outbox events after the id
-- @after, oldest first, through the partial index on parked events.
--
-- @after   @limit
SELECT id, scope, key, version, attempts, coalesce(last_error, ''),
	(extract(epoch FROM now() - created_at) * 1000)::bigint AS age_ms,
	(extract(epoch FROM now() - parked_at) * 1000)::bigint AS parked_ago_ms
FROM outbox
WHERE parked_at IS NOT NULL AND id > @after::bigint
ORDER BY id
LIMIT @limit::bigint

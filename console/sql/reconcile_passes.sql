-- reconcile_passes: the last passes the reconcilers recorded, newest
-- first.
--
-- @limit
SELECT id, result, report::text, coalesce(error, ''),
	(extract(epoch FROM now() - finished_at) * 1000)::bigint AS ago_ms,
	(extract(epoch FROM finished_at - started_at) * 1000)::bigint AS took_ms
FROM reconcile_passes
ORDER BY id DESC
LIMIT @limit::bigint

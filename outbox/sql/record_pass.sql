-- record_pass: records a reconcile pass that ran (finished or failed) and
-- deletes all but the last @keep, so the table stays a few rows long. Its
-- times are the database's: it ended now(), and began @duration before.
--
-- @result: ok, partial or failed
-- @report: the pass's report, the JSON line `reconciler --once` prints
-- @error: why a failed pass failed ('' otherwise)   @duration (interval)
-- @keep
WITH pass AS (
	INSERT INTO reconcile_passes (started_at, result, report, error)
	VALUES (now() - @duration::interval, @result, @report::jsonb, nullif(@error, ''))
	RETURNING id
)
DELETE FROM reconcile_passes WHERE id <= (SELECT id FROM pass) - @keep::bigint

-- requeue_events: writes back events that could not be delivered, behind
-- everything pending, with their attempts and last error; an event that
-- reached @max_attempts attempts is parked (the relay no longer takes it).
--
-- @scopes   @keys   @versions   @created_at   @attempts   @last_errors:
-- arrays of one length   @max_attempts
INSERT INTO outbox (scope, key, version, created_at, attempts, last_error, parked_at)
SELECT scope, key, version, created_at, attempts, last_error,
	CASE WHEN attempts >= @max_attempts THEN clock_timestamp() END
FROM unnest(@scopes::text[], @keys::text[], @versions::bigint[], @created_at::timestamptz[], @attempts::int[], @last_errors::text[])
	AS f(scope, key, version, created_at, attempts, last_error)

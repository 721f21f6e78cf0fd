-- requeue_events: writes back events that could not be delivered, behind
-- everything pending, with their attempts and last error; an event that
-- reached $7 attempts is parked (the relay no longer takes it).
--
-- $1 scopes   $2 keys   $3 versions   $4 created_at   $5 attempts
-- $6 last errors (arrays of one length)   $7 most attempts
INSERT INTO outbox (scope, key, version, created_at, attempts, last_error, parked_at)
SELECT scope, key, version, created_at, attempts, last_error,
	CASE WHEN attempts >= $7 THEN clock_timestamp() END
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::int[], $6::text[])
	AS f(scope, key, version, created_at, attempts, last_error)

-- batch_finish: records the end of every execution of a batch, in the
-- batch's transaction (which holds every key's lock and found no row for
-- any), as each key's first and only row at the version floor + 1, with
-- its outbox event: completed with its response, or failed (its handler's
-- writes rolled back to its savepoint), so a retry runs again and a
-- request with another payload is refused. One statement for all the keys,
-- one notification of the relays.
--
-- Every key must be inserted: when one has a row by now the statement
-- fails (onceonly_lease_lost), so the COMMIT sent behind it is skipped and
-- no message of the batch commits.
--
-- @scopes   @keys   @statuses ('completed' | 'failed')   @fingerprints
-- @response_statuses (integer, NULL when failed)   @response_content_types
-- @response_bodies (bytea)   @response_headers (keystate.EncodeHeader)
-- @failures (integer): 1 for a counted failure, else 0: one per key
-- @completed_ttl   @failed_ttl: how long the rows live (interval)
-- @notify: notify the relays (on @channel) in this statement's transaction
WITH input AS (
	SELECT i.*
	FROM unnest(@scopes::text[], @keys::text[], @statuses::text[], @fingerprints::text[],
		@response_statuses::integer[], @response_content_types::text[], @response_bodies::bytea[],
		@response_headers::text[], @failures::integer[])
		AS i (scope, key, status, fingerprint, response_status, response_content_type, response_body, response_headers, failures)
), inserted AS (
	INSERT INTO idempotency_keys AS k
		(scope, key, status, version, fingerprint,
		 response_status, response_content_type, response_body, response_headers, expires_at, failures)
	SELECT scope, key, status, coalesce((SELECT version FROM idempotency_version_floor), 0) + 1, fingerprint,
		response_status, response_content_type, response_body, response_headers,
		now() + CASE WHEN status = 'completed' THEN @completed_ttl::interval ELSE @failed_ttl::interval END,
		failures
	FROM input
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.*
), event AS (
	INSERT INTO outbox (scope, key, version) SELECT scope, key, version FROM inserted
), checked AS (
	SELECT CASE WHEN count(*) = cardinality(@keys::text[]) THEN true
		ELSE onceonly_lease_lost((@scopes::text[])[1], (@keys::text[])[1]) END AS whole,
		(CASE WHEN @notify THEN pg_notify(@channel, '') END) IS NULL AS notified
	FROM inserted
)
SELECT {{key_columns}}, c.notified
FROM checked c, inserted k
WHERE c.whole

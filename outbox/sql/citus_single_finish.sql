-- citus_single_finish: single_finish's completion (with @fail_when_lost) on
-- a distributed database (Citus), in the execution's transaction: the
-- key's first row, completed, at @floor + 1, the floor citus_single_probe
-- read in this transaction. VALUES and no CTE, so Citus routes it to the
-- key's shard in one round trip (single_finish's floor subquery and outbox
-- CTE make it an INSERT … SELECT pulled through the coordinator, and a
-- CTE's RETURNING read by the outer query an intermediate result). The
-- outbox event (citus_outbox_insert) and the NOTIFY (notify) are
-- statements of their own, sent behind it in the same round trip.
--
-- No ON CONFLICT: when the key has a row by now (a two-phase claim took
-- it), the insert fails (unique_violation), which the store reads as the
-- lease lost, and the COMMIT sent behind it is skipped, as single_finish's
-- onceonly_lease_lost does.
--
-- @scope   @key   @fingerprint   @floor (bigint)
-- @response_status   @response_content_type   @response_body
-- @response_headers (keystate.EncodeHeader)   @ttl (interval)   @ttl_ms (bigint)
-- It returns the key's columns as key_columns reads them (same order),
-- but lease_ms and expires_ms come in as parameters: Citus refuses now() in
-- a RETURNING clause, and the row's lease and expiry are now() plus them.
INSERT INTO idempotency_keys AS k
	(scope, key, status, version, fingerprint,
	 response_status, response_content_type, response_body, response_headers, expires_at, failures)
VALUES (@scope, @key, 'completed', @floor::bigint + 1, @fingerprint,
	@response_status::integer, @response_content_type, @response_body::bytea, @response_headers, now() + @ttl::interval, 0)
RETURNING k.scope, k.key, k.status, k.version, k.fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner, 0::bigint AS lease_ms,
	coalesce(k.response_status, 0) AS response_status, coalesce(k.response_content_type, '') AS response_content_type,
	coalesce(k.response_headers, '') AS response_headers, k.response_body, false AS body_omitted,
	@ttl_ms::bigint AS expires_ms, k.failures

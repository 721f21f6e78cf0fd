-- citus_claim_insert: claim_insert on a distributed database (Citus), in a
-- single-commit execution's transaction (the engine's promotion): the key
-- in_progress under the caller's owner and lease, at @floor + 1, the floor
-- citus_single_probe read in this transaction. VALUES and no CTE, so Citus
-- routes it to the key's shard in one round trip (see
-- citus_single_finish); the outbox event (citus_outbox_insert), the NOTIFY
-- and the commit without a flush wait are statements of their own, sent
-- behind it in the same round trip.
--
-- No ON CONFLICT: when the key has a row by now (a two-phase claim took
-- it), the insert fails (unique_violation), which the store reads as the
-- key lost, and the COMMIT sent behind it is skipped.
--
-- @scope   @key   @fingerprint   @owner (uuid)   @floor (bigint)
-- @lease (interval)   @lease_ms (bigint)   @ttl: how long the row lives
-- (interval)   @ttl_ms (bigint)
-- It returns the key's columns as key_columns reads them (same order),
-- but lease_ms and expires_ms come in as parameters: Citus refuses now() in
-- a RETURNING clause, and the row's lease and expiry are now() plus them.
INSERT INTO idempotency_keys AS k
	(scope, key, status, version, fingerprint, owner, lease_expires_at, expires_at)
VALUES (@scope, @key, 'in_progress', @floor::bigint + 1, @fingerprint, @owner::uuid,
	statement_timestamp() + @lease::interval, now() + @ttl::interval)
RETURNING k.scope, k.key, k.status, k.version, k.fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner, @lease_ms::bigint AS lease_ms,
	coalesce(k.response_status, 0) AS response_status, coalesce(k.response_content_type, '') AS response_content_type,
	coalesce(k.response_headers, '') AS response_headers, k.response_body, false AS body_omitted,
	@ttl_ms::bigint AS expires_ms, k.failures

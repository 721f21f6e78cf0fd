-- claim_peek: reads the row a claim met, and whether the claim may take it
-- over (claim_takeover): the row failed or its lease ran out (same
-- fingerprint), or it is past its expiry (any fingerprint: a new lifecycle
-- that keeps counting versions). Reading instead of locking keeps replays
-- and conflicts answered from Postgres free of writes. The recorded steps
-- come back for a claim that finds its own row: an earlier try of it
-- committed, and its answer was lost. live says whether the row is
-- unexpired, as claim_takeover is told.
--
-- @scope   @key   @fingerprint
SELECT {{key_columns}},
	(k.expires_at <= now()
		OR (k.fingerprint = @fingerprint AND (k.status = 'failed'
			OR (k.status = 'in_progress' AND k.lease_expires_at <= now())))) AS takeable,
	k.steps,
	k.expires_at > now() AS live
FROM idempotency_keys k
WHERE k.scope = @scope AND k.key = @key

-- get_key: reads the row of one key.
--
-- @scope   @key
SELECT k.scope, k.key, k.status, k.version, k.fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner,
	coalesce((extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint, 0) AS lease_ms,
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), coalesce(k.response_headers, ''), k.response_body, false AS body_omitted,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_ms
FROM idempotency_keys k
WHERE k.scope = @scope AND k.key = @key

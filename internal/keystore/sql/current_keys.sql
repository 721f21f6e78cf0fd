-- current_keys: reads the rows of many keys at once (the relay, the
-- reconciler's repairs). Bodies longer than @max_body bytes are not read:
-- the cache keeps a marker for them.
--
-- @scopes (text[])   @keys (text[], same length)   @max_body: largest body read
SELECT k.scope, k.key, k.status, k.version, k.fingerprint,
	coalesce(k.owner, '00000000-0000-0000-0000-000000000000'::uuid) AS owner,
	coalesce((extract(epoch FROM k.lease_expires_at - now()) * 1000)::bigint, 0) AS lease_ms,
	coalesce(k.response_status, 0), coalesce(k.response_content_type, ''), coalesce(k.response_headers, ''),
	CASE WHEN octet_length(k.response_body) <= @max_body THEN k.response_body END AS response_body,
	coalesce(octet_length(k.response_body) > @max_body, false) AS body_omitted,
	(extract(epoch FROM k.expires_at - now()) * 1000)::bigint AS expires_ms
FROM unnest(@scopes::text[], @keys::text[]) AS r(scope, key)
JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key

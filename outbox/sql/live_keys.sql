-- live_keys: which of the given keys have a live (unexpired) row.
--
-- @scopes (text[])   @keys (text[], same length)
SELECT k.scope, k.key
FROM unnest(@scopes::text[], @keys::text[]) AS r(scope, key)
JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key
WHERE k.expires_at > now()

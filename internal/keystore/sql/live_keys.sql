-- live_keys: which of the given keys have a live (unexpired) row.
--
-- $1 scopes (text[])   $2 keys (text[], same length)
SELECT k.scope, k.key
FROM unnest($1::text[], $2::text[]) AS r(scope, key)
JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key
WHERE k.expires_at > now()

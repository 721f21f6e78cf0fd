-- current_keys: reads the rows of many keys at once (the relay, the
-- reconciler's repairs). Bodies longer than @max_body bytes are not read:
-- the cache keeps a marker for them.
--
-- @scopes (text[])   @keys (text[], same length)   @max_body: largest body read
SELECT {{key_columns @max_body}}
FROM unnest(@scopes::text[], @keys::text[]) AS r(scope, key)
JOIN idempotency_keys k ON k.scope = r.scope AND k.key = r.key

-- keys_page: one page of the key list, in (scope, key) order after a
-- cursor: keyset pagination on the primary key, so a page costs the same at
-- any depth of a table of any size.
--
-- The inner query holds only conditions the primary key's index answers as
-- a range (the cursor, the scope, and a key prefix within a scope when the
-- column sorts by code point), and numbers the rows it walks; the outer one
-- filters by state and prefix. row_number()'s run condition (n <= @examine)
-- ends the index scan after @examine rows (Postgres 15), so a filter that
-- matches few keys, or none, still reads at most @examine rows: the page then
-- holds fewer than @limit matches, and its row n = @examine (shown or not,
-- matched says) is where the next page starts.
--
-- @after_scope   @after_key: the cursor, exclusive ('' and '' for the start;
--    every scope is non-empty)
-- @scope: only this scope ('': every scope)
-- @prefix: only keys that start with it ('': every key)
-- @prefix_end: '' or, when the column sorts by code point, the first string
--    past every key that starts with @prefix: with @scope, an index range
-- @state: only keys in this state ('': every state)
-- @examine: most rows walked   @limit: most rows returned
SELECT w.scope, w.key, w.status, w.version, coalesce(w.response_status, 0),
	coalesce((extract(epoch FROM w.lease_expires_at - now()) * 1000)::bigint, 0) AS lease_ms,
	(extract(epoch FROM w.expires_at - now()) * 1000)::bigint AS expires_ms,
	(extract(epoch FROM now() - w.updated_at) * 1000)::bigint AS updated_ago_ms,
	w.n, w.matched
FROM (
	SELECT k.scope, k.key, k.status, k.version, k.response_status, k.lease_expires_at, k.expires_at, k.updated_at,
		row_number() OVER (ORDER BY k.scope, k.key) AS n,
		(@state::text = '' OR k.status = @state::text) AND (@prefix::text = '' OR starts_with(k.key, @prefix::text)) AS matched
	FROM idempotency_keys k
	WHERE (k.scope, k.key) > (@after_scope::text, @after_key::text)
		AND (@scope::text = '' OR k.scope = @scope::text)
		AND (@scope::text = '' OR @prefix_end::text = '' OR (k.key >= @prefix::text AND k.key < @prefix_end::text))
) w
WHERE w.n <= @examine::bigint AND (w.matched OR w.n = @examine::bigint)
	AND (@scope::text = '' OR w.scope = @scope::text)
ORDER BY w.scope, w.key
LIMIT @limit::bigint

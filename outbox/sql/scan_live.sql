-- scan_live: one keyset page of live (unexpired) keys after ($1, $2), in
-- primary-key order, so a scan of any size reads each row once and holds
-- nothing between pages.
--
-- $1 scope after   $2 key after   $3 page size
SELECT scope, key, status, version FROM idempotency_keys
WHERE (scope, key) > ($1, $2) AND expires_at > now()
ORDER BY scope, key
LIMIT $3

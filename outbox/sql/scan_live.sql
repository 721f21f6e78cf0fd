-- scan_live: every live (unexpired) key, for the reconciler, which streams
-- the rows as one statement: one snapshot, so each row that exists when it
-- starts is read exactly once, and in the table's physical order (a
-- sequential scan: no random heap read per key, as a walk in primary-key
-- order would make).
SELECT scope, key, status, version FROM idempotency_keys
WHERE expires_at > now()

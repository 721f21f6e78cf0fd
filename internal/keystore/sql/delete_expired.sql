-- delete_expired: deletes up to @limit keys past their expiry whose version
-- the version floor covers (raise_version_floor runs first), through the
-- expires_at index and skipping locked rows, so each call is short and holds
-- few locks. Redis needs no event: its TTLs follow the same expiry.
--
-- @limit
DELETE FROM idempotency_keys k USING (
	SELECT scope, key FROM idempotency_keys
	WHERE expires_at <= now() AND version <= (SELECT version FROM idempotency_version_floor)
	ORDER BY expires_at LIMIT @limit FOR UPDATE SKIP LOCKED
) old
WHERE k.scope = old.scope AND k.key = old.key AND k.expires_at <= now()
	AND k.version <= (SELECT version FROM idempotency_version_floor)

-- delete_expired: deletes up to @limit keys past their expiry whose version
-- the version floor covers (raise_version_floor runs first), through the
-- expires_at index and skipping locked rows, so each call is short and holds
-- few locks. Redis needs no event: its TTLs follow the same expiry.
--
-- @limit
-- The and_scope markers: on a distributed database (Citus) the statement
--    runs scope by scope (@scope), on one shard (expired_scopes finds the scopes);
--    on one Postgres they are left out.
DELETE FROM idempotency_keys k USING (
	SELECT scope, key FROM idempotency_keys
	WHERE expires_at <= now() AND version <= (SELECT version FROM idempotency_version_floor) {{and_scope}}
	ORDER BY expires_at LIMIT @limit FOR UPDATE SKIP LOCKED
) old
WHERE k.scope = old.scope AND k.key = old.key AND k.expires_at <= now() {{and_scope k}}
	AND k.version <= (SELECT version FROM idempotency_version_floor)

-- delete_key: deletes the row of one key past its expiry (a key just
-- purged) whose version the version floor covers (raise_version_floor_key
-- runs first), as retention would on its next pass. A key that is live
-- again (claimed since its purge) is not deleted. Redis needs no event: the
-- purge's event deletes its value.
--
-- @scope   @key
DELETE FROM idempotency_keys
WHERE scope = @scope AND key = @key AND expires_at <= now()
	AND version <= (SELECT version FROM idempotency_version_floor)
